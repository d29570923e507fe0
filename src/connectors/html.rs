//! HTML to indexable text: headings become markdown `#` lines, scripts, styles and page chrome
//! are dropped, entities are decoded, and `<title>` is kept apart as the document's title.
//!
//! html5ever's tokenizer (the spec's tokenizer, from Servo) feeds a flat walk over the tokens.
//! Not a DOM: html5ever's tree builder scans its stack of open elements on each start tag, so a
//! 40,000-deep `<div>` nest took 8 s here and a 2 MiB one would take minutes, and converters that
//! recurse over the tree (htmd) overflow the stack at 10,000 levels. Text extraction needs only
//! the tokens in document order, which takes linear time and a constant stack.

use std::cell::RefCell;

use html5ever::tendril::StrTendril;
use html5ever::tokenizer::states::RawKind;
use html5ever::tokenizer::{BufferQueue, Tag, TagKind, Token, TokenSink, TokenSinkResult, Tokenizer, TokenizerOpts};
use html5ever::{LocalName, TokenizerResult};

/// What an HTML page gives to the index.
#[derive(Debug, Default, PartialEq)]
pub struct Page {
    /// Markdown-like text: headings as `#` lines, list items as `- `, `<pre>` as fenced code.
    pub text: String,
    /// The first `<title>`, whitespace collapsed; `None` when there is none or it is blank.
    pub title: Option<String>,
    /// The text of the first `<h1>`, for pages without a `<title>`.
    pub first_h1: Option<String>,
    /// How many tags the tokenizer saw: none means the file was not HTML at all.
    pub tags: usize,
}

/// Converts an HTML document to text. Never fails: the tokenizer recovers from any input, as
/// browsers do.
pub fn to_text(html: &str) -> Page {
    let input = BufferQueue::default();
    // Fed in pieces: a tendril holds at most 4 GiB, and max_file_bytes has no upper bound.
    let mut rest = html;
    while !rest.is_empty() {
        let mut cut = rest.len().min(PIECE);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (piece, tail) = rest.split_at(cut);
        input.push_back(StrTendril::from_slice(piece));
        rest = tail;
    }
    let tokenizer = Tokenizer::new(Sink(RefCell::new(Walk::default())), TokenizerOpts::default());
    // `Script` and `EncodingIndicator` pauses come only from sinks that ask for them; this one
    // never does, so the first `Done` means every piece was read.
    while !matches!(tokenizer.feed(&input), TokenizerResult::Done) {}
    tokenizer.end();
    tokenizer.sink.0.into_inner().finish()
}

const PIECE: usize = 1 << 20;

/// Elements whose content is not the page's text: code, styling, fallbacks for old browsers,
/// inert templates, drawings and navigation menus.
const DROPPED: &[&str] =
    &["script", "style", "noscript", "template", "svg", "math", "nav", "iframe", "object", "canvas", "audio", "video"];

/// Elements that start a paragraph of their own (a blank line around them).
const PARAGRAPHS: &[&str] = &[
    "p",
    "div",
    "section",
    "article",
    "header",
    "footer",
    "main",
    "aside",
    "blockquote",
    "figure",
    "table",
    "ul",
    "ol",
    "dl",
    "form",
    "fieldset",
    "address",
    "details",
    "hr",
    "body",
    "html",
];

/// Elements that start a new line.
const LINES: &[&str] = &["li", "dt", "dd", "tr", "caption", "figcaption", "summary", "legend", "option"];

struct Sink(RefCell<Walk>);

impl TokenSink for Sink {
    type Handle = ();

    fn process_token(&self, token: Token, _line: u64) -> TokenSinkResult<()> {
        let mut walk = self.0.borrow_mut();
        match token {
            Token::TagToken(tag) => walk.tag(&tag),
            Token::CharacterTokens(text) => {
                walk.text(&text);
                TokenSinkResult::Continue
            }
            _ => TokenSinkResult::Continue,
        }
    }
}

/// An element whose whole subtree is dropped.
struct Dropped {
    name: LocalName,
    /// Open elements of the same name, so `<nav><nav></nav></nav>` ends at the outer close.
    depth: u32,
}

#[derive(Default)]
struct Walk {
    out: Out,
    dropped: Option<Dropped>,
    /// Text of the `<title>` being read.
    title_text: Option<String>,
    title: Option<String>,
    /// The level of the heading being read.
    heading: Option<usize>,
    h1_text: Option<String>,
    first_h1: Option<String>,
    /// Raw text of the `<pre>` being read, and how many are open inside it.
    pre: Option<(String, u32)>,
    /// Where the current table row starts in the text.
    row_start: usize,
    tags: usize,
}

impl Walk {
    fn tag(&mut self, tag: &Tag) -> TokenSinkResult<()> {
        self.tags += 1;
        let name: &str = &tag.name;
        let start = tag.kind == TagKind::StartTag;
        if let Some(dropped) = &mut self.dropped {
            // Drawings are foreign content, where `<style>` and `<title>` are plain elements.
            let foreign = matches!(&*dropped.name, "svg" | "math");
            if *name == *dropped.name {
                if !start {
                    dropped.depth -= 1;
                } else if !tag.self_closing {
                    dropped.depth += 1;
                }
                if dropped.depth == 0 {
                    self.dropped = None;
                }
            }
            return if start && !foreign { raw_state(name) } else { TokenSinkResult::Continue };
        }
        if !start {
            self.end_tag(name);
            return TokenSinkResult::Continue;
        }
        if DROPPED.contains(&name) {
            if !tag.self_closing {
                self.dropped = Some(Dropped { name: tag.name.clone(), depth: 1 });
            }
            return raw_state(name);
        }
        if let Some((_, open)) = &mut self.pre {
            match name {
                "pre" | "listing" => *open += 1,
                "br" => self.text("\n"),
                _ => {}
            }
            return raw_state(name);
        }
        match name {
            "title" => self.title_text = Some(String::new()),
            "pre" | "listing" | "xmp" => self.pre = Some((String::new(), 1)),
            "br" if self.heading.is_some() => self.out.space(),
            "br" => self.out.block(1),
            "tr" => {
                self.out.block(1);
                self.row_start = self.out.text.len();
            }
            // Layout tables have many empty cells: a separator only between cells with text.
            "td" | "th" if self.out.text.len() > self.row_start => self.out.separate(" | "),
            "li" => {
                self.out.block(1);
                self.out.prefix("- ".to_string());
            }
            _ => {
                if let Some(level) = heading_level(name) {
                    self.out.block(2);
                    self.out.prefix(format!("{} ", "#".repeat(level)));
                    self.heading = Some(level);
                    // A heading opened inside an unclosed `<h1>` ends it.
                    self.end_h1();
                    if level == 1 && self.first_h1.is_none() {
                        self.h1_text = Some(String::new());
                    }
                } else {
                    self.block_for(name);
                }
            }
        }
        raw_state(name)
    }

    fn end_tag(&mut self, name: &str) {
        if let Some((text, open)) = &mut self.pre {
            if matches!(name, "pre" | "listing" | "xmp") {
                *open -= 1;
                if *open == 0 {
                    let text = std::mem::take(text);
                    self.pre = None;
                    self.out.code_block(&text);
                }
            }
            return;
        }
        match name {
            "title" => self.end_title(),
            "li" => {
                self.out.drop_prefix();
                self.out.block(1);
            }
            _ => {
                if heading_level(name).is_some() && self.heading.is_some() {
                    self.heading = None;
                    self.end_h1();
                    self.out.drop_prefix();
                    self.out.block(2);
                } else {
                    self.block_for(name);
                }
            }
        }
    }

    /// Line breaks for block elements; inside a heading they are spaces, so the heading stays
    /// one line.
    fn block_for(&mut self, name: &str) {
        let lines = if PARAGRAPHS.contains(&name) {
            2
        } else if LINES.contains(&name) {
            1
        } else {
            return;
        };
        if self.heading.is_some() {
            self.out.space();
        } else {
            self.out.block(lines);
        }
    }

    fn end_title(&mut self) {
        if let Some(text) = self.title_text.take() {
            if self.title.is_none() {
                self.title = title_from(&text);
            }
        }
    }

    fn end_h1(&mut self) {
        if let Some(text) = self.h1_text.take() {
            self.first_h1 = title_from(&text);
        }
    }

    fn text(&mut self, text: &str) {
        if self.dropped.is_some() {
            return;
        }
        if let Some(title) = &mut self.title_text {
            title.push_str(text);
        } else if let Some((pre, _)) = &mut self.pre {
            pre.push_str(text);
        } else {
            if let Some(h1) = &mut self.h1_text {
                h1.push_str(text);
            }
            self.out.words(text);
        }
    }

    fn finish(mut self) -> Page {
        // Unclosed elements at the end of the file still count.
        self.end_title();
        if let Some((text, _)) = self.pre.take() {
            self.out.code_block(&text);
        }
        self.end_h1();
        let mut text = self.out.text;
        text.push('\n');
        Page { text, title: self.title, first_h1: self.first_h1, tags: self.tags }
    }
}

fn heading_level(name: &str) -> Option<usize> {
    match name {
        "h1" => Some(1),
        "h2" => Some(2),
        "h3" => Some(3),
        "h4" => Some(4),
        "h5" => Some(5),
        "h6" => Some(6),
        _ => None,
    }
}

/// The tokenizer state a start tag switches to, as the HTML tree builder would set it: without
/// it, `if (a<b)` in a script would read as a tag and `</p>` in a string would end nothing.
fn raw_state(name: &str) -> TokenSinkResult<()> {
    match name {
        "script" => TokenSinkResult::RawData(RawKind::ScriptData),
        "style" | "xmp" | "iframe" | "noembed" | "noframes" | "noscript" => TokenSinkResult::RawData(RawKind::Rawtext),
        "title" | "textarea" => TokenSinkResult::RawData(RawKind::Rcdata),
        "plaintext" => TokenSinkResult::Plaintext,
        _ => TokenSinkResult::Continue,
    }
}

/// A title from element text: whitespace collapsed, and cut at [`TITLE_CHARS`], since an unclosed
/// `<title>` runs to the end of the file (as in browsers) and a title is repeated on every chunk.
fn title_from(text: &str) -> Option<String> {
    let mut title = String::new();
    for word in text.split_whitespace() {
        if !title.is_empty() {
            title.push(' ');
        }
        title.push_str(word);
        if title.len() >= TITLE_CHARS * 4 {
            break;
        }
    }
    if let Some((cut, _)) = title.char_indices().nth(TITLE_CHARS) {
        title.truncate(cut);
        title.push('…');
    }
    (!title.is_empty()).then_some(title)
}

const TITLE_CHARS: usize = 200;

/// The text being written: whitespace collapsed, line breaks and prefixes held back until a
/// word follows them, so empty elements leave no blank lines or bare `#`.
#[derive(Default)]
struct Out {
    text: String,
    space: bool,
    breaks: usize,
    prefix: Option<String>,
    /// Written instead of the space before the next word on the same line.
    separator: Option<&'static str>,
}

impl Out {
    fn words(&mut self, text: &str) {
        if text.starts_with(char::is_whitespace) {
            self.space();
        }
        let mut words = text.split_whitespace().peekable();
        while let Some(word) = words.next() {
            self.word(word);
            if words.peek().is_some() {
                self.space();
            }
        }
        if text.ends_with(char::is_whitespace) {
            self.space();
        }
    }

    fn word(&mut self, word: &str) {
        if !self.text.is_empty() {
            if self.breaks > 0 {
                for _ in 0..self.breaks {
                    self.text.push('\n');
                }
            } else if let Some(separator) = self.separator {
                self.text.push_str(separator);
            } else if self.space {
                self.text.push(' ');
            }
        }
        self.breaks = 0;
        self.space = false;
        self.separator = None;
        if let Some(prefix) = self.prefix.take() {
            self.text.push_str(&prefix);
        }
        self.text.push_str(word);
    }

    fn space(&mut self) {
        self.space = true;
    }

    fn block(&mut self, lines: usize) {
        self.breaks = self.breaks.max(lines);
        self.space = false;
        self.separator = None;
    }

    fn separate(&mut self, separator: &'static str) {
        self.separator = Some(separator);
    }

    fn prefix(&mut self, prefix: String) {
        self.prefix = Some(prefix);
    }

    fn drop_prefix(&mut self) {
        self.prefix = None;
    }

    /// A fenced code block, its fence longer than any backtick run inside so that no line of
    /// the code can close it.
    fn code_block(&mut self, code: &str) {
        // As in browsers, a newline right after `<pre>` is not content.
        let code = code.strip_prefix('\n').unwrap_or(code).trim_end();
        if code.trim().is_empty() {
            return;
        }
        let longest = code.split(|c| c != '`').map(str::len).max().unwrap_or(0);
        let fence = "`".repeat(longest.max(2) + 1);
        // A list marker before a fence would hide the fence from the chunker.
        self.drop_prefix();
        self.block(2);
        self.word(&format!("{fence}\n{code}\n{fence}"));
        self.block(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headings_paragraphs_lists_and_entities() {
        let page = to_text(
            "<!doctype html><html><head><title> The  Guide </title><style>.x{color:red}</style></head>\
             <body><h1>Install</h1><p>Caf&eacute; &amp; tea &#x2014; <b>bold</b> text</p>\
             <ul><li>one</li><li>two</li></ul><h2>Use <br>it</h2><p>a<br>b</p></body></html>",
        );
        assert_eq!(page.title.as_deref(), Some("The Guide"));
        assert_eq!(page.first_h1.as_deref(), Some("Install"));
        assert_eq!(page.text, "# Install\n\nCafé & tea — bold text\n\n- one\n- two\n\n## Use it\n\na\nb\n");
    }

    #[test]
    fn scripts_styles_and_chrome_are_dropped() {
        let page = to_text(
            "<nav><a href=x>Home</a><nav>inner</nav>still nav</nav>\
             <script>var s = '</p><h1>fake</h1>'; if (a<b) {}</script>\
             <noscript>enable js</noscript><template><p>tpl</p></template>\
             <svg><title>icon</title><text>drawn</text></svg><p>kept</p>",
        );
        assert_eq!(page.text, "kept\n");
        // The svg's <title> is not the page's.
        assert_eq!(page.title, None);
        assert_eq!(page.first_h1, None);
    }

    #[test]
    fn no_tag_names_or_attributes_reach_the_text() {
        let page = to_text("<div class=\"wrap\" id=main><span style=\"x\">word</span><img src=a.png alt=pic></div>");
        assert_eq!(page.text, "word\n");
    }

    #[test]
    fn pre_becomes_a_fence_that_its_content_cannot_close() {
        let page = to_text("<p>see</p><pre>\n# not a heading\n```\n  indented</pre><p>after</p>");
        assert_eq!(page.text, "see\n\n````\n# not a heading\n```\n  indented\n````\n\nafter\n");
    }

    #[test]
    fn tables_keep_rows_on_lines() {
        let page = to_text(
            "<table><tr><th>Name</th><th>Value</th></tr><tr><td>a</td><td>1</td></tr>\
             <tr><td></td><td> </td><td>only</td><td></td></tr></table>",
        );
        assert_eq!(page.text, "Name | Value\na | 1\nonly\n");
    }

    #[test]
    fn unclosed_elements_and_plain_text() {
        let page = to_text("<title>Only a title");
        assert_eq!((page.title.as_deref(), page.text.as_str()), (Some("Only a title"), "\n"));
        let page = to_text("just words & more\nwords");
        assert_eq!((page.tags, page.text.as_str()), (0, "just words & more words\n"));
        let page = to_text("<h1>Never closed");
        assert_eq!(page.first_h1.as_deref(), Some("Never closed"));
        let page = to_text("<h1>Outer<h2>Inner</h2>");
        assert_eq!(page.first_h1.as_deref(), Some("Outer"));
        let page = to_text(&format!("<title>{}", "word ".repeat(10_000)));
        let title = page.title.unwrap();
        assert!(title.starts_with("word word") && title.ends_with('…'), "{title}");
        assert_eq!(title.chars().count(), TITLE_CHARS + 1);
        assert_eq!(to_text("").text, "\n");
    }

    #[test]
    fn deep_nesting_does_not_overflow_and_keeps_the_text() {
        let depth = 10_000;
        let html = format!("{}deep{}", "<div><span>".repeat(depth), "</span></div>".repeat(depth));
        // Run on a small stack: sync reads files on blocking threads, not main.
        let page = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || to_text(&html))
            .expect("spawn")
            .join()
            .expect("no overflow");
        assert_eq!(page.text, "deep\n");
        // A 2 MiB nest, the default max_file_bytes, is read in one pass too.
        let page = to_text(&"<div>".repeat(2 * 1024 * 1024 / 5));
        assert_eq!(page.text, "\n");
    }
}
