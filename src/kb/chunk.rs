//! Paragraph-boundary chunking of document text for the full-text index.
//!
//! Text is cut into blocks (paragraphs, whole code fences, headings glued to what follows) and the
//! blocks are packed greedily into chunks. Every chunk after the first repeats the tail of the one
//! before it, so a phrase that straddles a cut is still found. Sizes are estimated, not tokenized:
//! four bytes of UTF-8 per token, which lets all the packing arithmetic run on byte lengths.

use std::ops::Range;

/// Bytes of UTF-8 counted as one token by [`estimate_tokens`].
const BYTES_PER_TOKEN: usize = 4;
/// What joins two blocks, and a heading to the paragraph after it.
const PARAGRAPH: &str = "\n\n";
/// What joins two lines of one block.
const LINE: &str = "\n";
/// What joins two pieces of an oversized line that was cut at whitespace.
const SPACE: &str = " ";

/// Limits for one chunking run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSpec {
    /// Most tokens in one chunk, overlap included.
    pub max_tokens: usize,
    /// Tokens of the previous chunk repeated at the start of the next; 0 for none.
    pub overlap_tokens: usize,
}

/// One chunk of a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Position in the document, from 0.
    pub index: usize,
    /// The chunk text, overlap included, without leading or trailing blank lines.
    pub text: String,
    /// [`estimate_tokens`] of `text`.
    pub tokens: usize,
}

/// Estimated token count: about four bytes of UTF-8 per token, rounded up; 0 for "".
pub fn estimate_tokens(text: &str) -> usize {
    text.len().div_ceil(BYTES_PER_TOKEN)
}

/// Splits `text` into chunks.
///
/// Blocks are separated by blank lines; a fenced code block is one block whatever it contains,
/// and a heading joins the block after it. Blocks are packed greedily, joined by a blank line.
/// A block that cannot fit in a chunk of its own is cut between lines (a heading stays with the
/// line after it), and only a line that alone exceeds the limit is cut inside, at whitespace when
/// there is some.
///
/// Each chunk after the first starts with the last `overlap_tokens` or fewer of the previous
/// chunk, cut at a word boundary (at a line start when that keeps at least half of it). The
/// overlap counts toward `max_tokens`; it is shortened, possibly to nothing, only when the next
/// block or line would otherwise not fit whole, since keeping a block intact matters more.
pub fn chunk(text: &str, spec: ChunkSpec) -> Vec<Chunk> {
    let (lines, blocks) = parse(text);
    let mut packer = Packer::new(spec);
    for block in blocks {
        packer.add_block(&lines[block]);
    }
    packer.finish()
}

/// One line of the document as packing sees it.
#[derive(Clone, Copy, Debug)]
struct Line<'a> {
    text: &'a str,
    /// What joins this line to the one before it in its block.
    sep: &'static str,
    /// A heading: it introduces what follows, so a chunk should not end on it.
    sticky: bool,
}

/// Splits `text` into lines and groups them into blocks, given as ranges of those lines.
fn parse(text: &str) -> (Vec<Line<'_>>, Vec<Range<usize>>) {
    let mut lines: Vec<Line> = Vec::new();
    let mut blocks = Vec::new();
    let mut start = None; // first line of the open block
    let mut gap = false; // blank lines seen after a heading that keeps its block open
    let mut fence: Option<Fence> = None;
    for raw in text.lines() {
        if fence.is_none() && raw.trim().is_empty() {
            match start {
                // The block stays open across the blank line, so the heading meets its paragraph.
                Some(_) if lines.last().is_some_and(|line| line.sticky) => gap = true,
                Some(first) => {
                    blocks.push(first..lines.len());
                    start = None;
                }
                None => {}
            }
            continue;
        }
        let sep = if start.is_some() && !gap { LINE } else { PARAGRAPH };
        start.get_or_insert(lines.len());
        gap = false;
        let sticky = fence.is_none() && is_heading(raw);
        fence = match fence {
            Some(open) if open.closes(raw) => None,
            Some(open) => Some(open),
            None => Fence::opens(raw),
        };
        lines.push(Line { text: raw, sep, sticky });
    }
    if let Some(first) = start {
        blocks.push(first..lines.len());
    }
    (lines, blocks)
}

/// Whether `line` is an ATX markdown heading: one to six `#` then whitespace or nothing.
fn is_heading(line: &str) -> bool {
    let line = line.trim_start();
    let hashes = line.bytes().take_while(|&b| b == b'#').count();
    (1..=6).contains(&hashes) && line[hashes..].chars().next().is_none_or(char::is_whitespace)
}

/// An open code fence: its marker byte (backtick or tilde) and how many opened it.
#[derive(Clone, Copy, Debug)]
struct Fence {
    marker: u8,
    len: usize,
}

impl Fence {
    /// The fence `line` opens, if any. Indentation is allowed so fences inside lists count.
    fn opens(line: &str) -> Option<Self> {
        let line = line.trim_start();
        let marker = *line.as_bytes().first()?;
        if marker != b'`' && marker != b'~' {
            return None;
        }
        let len = line.bytes().take_while(|&b| b == marker).count();
        // A backtick fence's info string has no backticks (CommonMark); that rules out ```x```.
        let inline = marker == b'`' && line[len..].contains('`');
        (len >= 3 && !inline).then_some(Self { marker, len })
    }

    /// Whether `line` closes this fence: at least as many of the same marker and nothing else.
    fn closes(self, line: &str) -> bool {
        let line = line.trim();
        line.len() >= self.len && line.bytes().all(|b| b == self.marker)
    }
}

/// Accumulates chunks; all sizes are in bytes, which keeps every chunk within the token limit.
struct Packer {
    /// Most bytes in a chunk: `max_tokens` whole tokens.
    limit: usize,
    /// Most bytes of overlap.
    overlap: usize,
    chunks: Vec<Chunk>,
    /// The chunk being filled: overlap first, then new text.
    cur: String,
    /// Whether `cur` holds anything beyond its overlap and blank lines, i.e. is worth emitting.
    has_new: bool,
}

impl Packer {
    fn new(spec: ChunkSpec) -> Self {
        // A zero limit could never make progress, and the caller promises overlap < max.
        let max_tokens = spec.max_tokens.max(1);
        let overlap_tokens = spec.overlap_tokens.min(max_tokens - 1);
        Self {
            limit: max_tokens.saturating_mul(BYTES_PER_TOKEN),
            overlap: overlap_tokens.saturating_mul(BYTES_PER_TOKEN),
            chunks: Vec::new(),
            cur: String::new(),
            has_new: false,
        }
    }

    /// Adds one block: whole if it fits in a chunk, else unit by unit, else line by line.
    fn add_block(&mut self, block: &[Line]) {
        if self.place(block) {
            return;
        }
        // A unit is any headings plus the line after them, so a cut never falls after a heading.
        for unit in block.split_inclusive(|line| !line.sticky) {
            if self.place(unit) {
                continue;
            }
            // Too long for one chunk: keep the headings together, then place the line they
            // introduce, which if it is long starts right after them.
            let (headings, rest) = unit.split_at(unit.iter().take_while(|l| l.sticky).count());
            if !self.place(headings) {
                headings.iter().for_each(|line| self.place_line(*line));
            }
            rest.iter().for_each(|line| self.place_line(*line));
        }
    }

    /// Places one line, cutting it only if it is too long for any chunk.
    fn place_line(&mut self, line: Line) {
        if !self.place(std::slice::from_ref(&line)) {
            self.place_long_line(line);
        }
    }

    /// Appends `lines` to the current chunk, or to a new one if they do not fit. False, with
    /// nothing done, when they are too long for any chunk.
    fn place(&mut self, lines: &[Line]) -> bool {
        let Some(first) = lines.first() else {
            return true;
        };
        let len = lines.iter().map(|line| line.sep.len() + line.text.len()).sum::<usize>() - first.sep.len();
        if !self.make_room(first.sep, len) {
            return false;
        }
        for line in lines {
            self.append(line.sep, line.text);
        }
        true
    }

    /// Cuts a line too long for any chunk into pieces, each as long as its chunk allows: the
    /// first fills what is left of the current chunk. Cuts fall at whitespace; only a word that
    /// alone exceeds a chunk is cut inside, between chars.
    fn place_long_line(&mut self, line: Line) {
        let (mut sep, mut rest) = (line.sep, line.text);
        while !self.make_room(sep, rest.len()) {
            let word = first_word_len(rest);
            // Make room for the first word (maybe in a new chunk), then take all words that fit.
            let head = self.make_room(sep, word).then(|| split_at_space(rest, self.room(sep))).flatten();
            if let Some((head, tail)) = head {
                self.append(sep, head);
                (sep, rest) = (SPACE, tail);
            } else {
                // The word is longer than a chunk, so it is cut anyway: fill what is left here,
                // needing room for only one char, so every round makes progress.
                let first = rest.chars().next().map_or(0, char::len_utf8);
                self.make_room(sep, first);
                let cut = floor_char_boundary(rest, self.room(sep));
                self.append(sep, &rest[..cut]);
                (sep, rest) = ("", &rest[cut..]);
            }
        }
        // Empty when the line ended in whitespace, which a trailing separator would only pad.
        if !rest.is_empty() {
            self.append(sep, rest);
        }
    }

    /// Ensures `len` more bytes joined by `sep` fit, starting a new chunk if they must. False
    /// when `len` exceeds a whole chunk, in which case nothing changes.
    fn make_room(&mut self, sep: &str, len: usize) -> bool {
        if self.used(sep) + len <= self.limit {
            return true;
        }
        if len > self.limit {
            return false;
        }
        self.break_chunk(sep.len() + len);
        true
    }

    /// Bytes still free in the current chunk once `sep` is added.
    fn room(&self, sep: &str) -> usize {
        self.limit.saturating_sub(self.used(sep))
    }

    /// Bytes taken in the current chunk once `sep` is added; `sep` is skipped while it is empty.
    fn used(&self, sep: &str) -> usize {
        if self.cur.is_empty() {
            0
        } else {
            self.cur.len() + sep.len()
        }
    }

    fn append(&mut self, sep: &str, text: &str) {
        if !self.cur.is_empty() {
            self.cur.push_str(sep);
        }
        self.cur.push_str(text);
        self.has_new |= !text.trim().is_empty();
    }

    /// Emits the current chunk and starts the next with an overlap that leaves `room` bytes.
    ///
    /// When the current chunk holds nothing new it is not emitted; its overlap is just taken
    /// again, shorter, which is how a block that needs the space shrinks the overlap.
    fn break_chunk(&mut self, room: usize) {
        if self.has_new {
            self.emit();
        }
        let max = self.overlap.min(self.limit.saturating_sub(room));
        self.cur.clear();
        if let Some(last) = self.chunks.last() {
            self.cur.push_str(overlap_tail(&last.text, max));
        }
        self.has_new = false;
    }

    fn emit(&mut self) {
        let text = trim_blank_lines(&self.cur);
        self.chunks.push(Chunk { index: self.chunks.len(), tokens: estimate_tokens(text), text: text.to_owned() });
    }

    fn finish(mut self) -> Vec<Chunk> {
        if self.has_new {
            self.emit();
        }
        self.chunks
    }
}

/// Cuts from `line` the longest head of at most `room` bytes that ends at whitespace, dropping
/// the whitespace; None when no word fits.
fn split_at_space(line: &str, room: usize) -> Option<(&str, &str)> {
    let cut = floor_char_boundary(line, room);
    let space =
        if line[cut..].starts_with(char::is_whitespace) { cut } else { line[..cut].rfind(char::is_whitespace)? };
    // Whitespace that is only indentation leaves no head.
    let head = line[..space].trim_end();
    (!head.is_empty()).then(|| (head, line[space..].trim_start()))
}

/// Bytes up to the end of the first word of `text`, leading whitespace included.
fn first_word_len(text: &str) -> usize {
    let start = text.len() - text.trim_start().len();
    text[start..].find(char::is_whitespace).map_or(text.len(), |end| start + end)
}

/// The largest char boundary of `text` at or below `index`.
fn floor_char_boundary(text: &str, index: usize) -> usize {
    if index >= text.len() {
        return text.len();
    }
    // A UTF-8 char is at most four bytes, so a boundary is at most three steps back.
    (0..=index).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0)
}

/// The longest suffix of `text` of at most `max` bytes that starts a word, or starts a line when
/// that keeps at least half of `max`; empty when no word starts in the last `max` bytes.
fn overlap_tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    if max == 0 {
        return "";
    }
    let mut from = text.len() - max;
    while !text.is_char_boundary(from) {
        from += 1;
    }
    let window = &text[from..];
    let mut prev = text[..from].chars().next_back();
    let (mut word, mut line) = (None, None);
    for (i, c) in window.char_indices() {
        if line.is_none() && prev == Some('\n') && c != '\n' {
            line = Some(i);
        }
        if word.is_none() && prev.is_some_and(char::is_whitespace) && !c.is_whitespace() {
            word = Some(i);
        }
        if line.is_some() {
            break; // a word start, if any, never comes after the first line start
        }
        prev = Some(c);
    }
    match (line, word) {
        (Some(line), _) if (window.len() - line) * 2 >= max => &window[line..],
        (_, Some(word)) => &window[word..],
        _ => "",
    }
}

/// `text` without its leading and trailing blank lines.
fn trim_blank_lines(text: &str) -> &str {
    let (Some(first), Some(last)) = (text.find(|c: char| !c.is_whitespace()), text.rfind(|c: char| !c.is_whitespace()))
    else {
        return "";
    };
    let start = text[..first].rfind('\n').map_or(0, |i| i + 1);
    let end = text[last..].find('\n').map_or(text.len(), |i| last + i);
    &text[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(max_tokens: usize, overlap_tokens: usize) -> ChunkSpec {
        ChunkSpec { max_tokens, overlap_tokens }
    }

    /// Bytes at the start of `next` that repeat the end of `prev` and end before whitespace.
    /// With unique words this is exactly the overlap.
    fn overlap_len(prev: &str, next: &str) -> usize {
        (1..=prev.len().min(next.len()))
            .rev()
            .find(|&k| {
                next.is_char_boundary(k)
                    && next[k..].chars().next().is_none_or(char::is_whitespace)
                    && prev.ends_with(&next[..k])
            })
            .unwrap_or(0)
    }

    fn words(text: &str) -> Vec<&str> {
        text.split_whitespace().collect()
    }

    /// Asserts the invariants every run must keep, and that the words of `text` come back in
    /// order, once each, when each chunk's overlap is dropped. `text` must have unique words
    /// and no word longer than a chunk (a word cut in two would not come back whole).
    fn check(text: &str, spec: ChunkSpec, chunks: &[Chunk]) {
        let limit = spec.max_tokens * BYTES_PER_TOKEN;
        let mut rebuilt = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            assert_eq!(c.index, i);
            assert_eq!(c.tokens, estimate_tokens(&c.text));
            assert!(c.tokens <= spec.max_tokens, "{spec:?} chunk {i}: {:?}", c.text);
            assert!(!c.text.lines().next().unwrap().trim().is_empty(), "{c:?}");
            assert!(!c.text.lines().last().unwrap().trim().is_empty(), "{c:?}");
            let overlap = match i {
                0 => 0,
                _ => overlap_len(&chunks[i - 1].text, &c.text),
            };
            assert!(overlap <= spec.overlap_tokens * BYTES_PER_TOKEN, "{spec:?} {c:?}");
            if spec.overlap_tokens == 0 {
                assert_eq!(overlap, 0, "{spec:?} {c:?}");
            }
            if overlap > 0 {
                // The overlap starts a word of the previous chunk.
                let prev = &chunks[i - 1].text;
                let start = prev.len() - overlap;
                assert!(start == 0 || prev[..start].ends_with(char::is_whitespace));
            }
            rebuilt.extend(words(&c.text[overlap..]));
        }
        assert_eq!(rebuilt, words(text), "{spec:?}");
        assert!(chunks.len() * limit >= text.trim().len());
    }

    #[test]
    fn estimate_rounds_bytes_up_to_tokens() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("a"), 1);
        assert_eq!(estimate_tokens("abcd"), 1);
        assert_eq!(estimate_tokens("abcde"), 2);
        assert_eq!(estimate_tokens("日本"), 2); // six bytes
    }

    #[test]
    fn empty_or_blank_text_gives_no_chunks() {
        assert!(chunk("", spec(10, 2)).is_empty());
        assert!(chunk(" \n\n\t\n   \r\n", spec(10, 2)).is_empty());
    }

    #[test]
    fn short_paragraph_is_one_chunk() {
        let text = "A short paragraph.\nWith two lines.";
        let chunks = chunk(&format!("\n\n{text}\n\n\n"), spec(100, 10));
        assert_eq!(chunks, vec![Chunk { index: 0, text: text.to_owned(), tokens: estimate_tokens(text) }]);
    }

    #[test]
    fn paragraphs_are_packed_greedily_and_whole() {
        let paragraphs: Vec<String> =
            (0..40).map(|i| format!("Paragraph {i} says alpha{i} beta{i} gamma{i}.")).collect();
        let text = paragraphs.join("\n\n\n");
        let spec = spec(25, 0);
        let chunks = chunk(&text, spec);
        assert!(chunks.len() > 5);
        check(&text, spec, &chunks);
        let parts: Vec<&str> = chunks.iter().flat_map(|c| c.text.split("\n\n")).collect();
        assert_eq!(parts, paragraphs);
        // Greedy: the paragraph that starts the next chunk would not have fitted in this one.
        for pair in chunks.windows(2) {
            let next = pair[1].text.split("\n\n").next().unwrap();
            assert!(estimate_tokens(&format!("{}\n\n{next}", pair[0].text)) > spec.max_tokens);
        }
    }

    const FENCE: &str = "```rust\nfn a() {}\n\n\nfn b() {}\n```";

    #[test]
    fn code_fence_with_blank_lines_stays_whole_when_it_fits() {
        let text = format!("Intro paragraph here.\n\n{FENCE}\n\nOutro paragraph here.");
        assert_eq!(chunk(&text, spec(100, 10))[0].text, text);
        // The fence fits alone but not beside the intro: it moves whole to the next chunk, and
        // the overlap shrinks rather than cutting it.
        for overlap in [0, 3] {
            let chunks = chunk(&text, spec(estimate_tokens(FENCE), overlap));
            assert!(chunks.len() > 1);
            assert!(chunks.iter().any(|c| c.text == FENCE), "{chunks:#?}");
        }
    }

    #[test]
    fn oversized_code_fence_is_cut_only_between_lines() {
        let body: Vec<String> = (0..60)
            .map(|i| match i % 7 {
                6 => String::new(),
                _ => format!("let x{i} = {i}; // c{i}"),
            })
            .collect();
        let text = format!("Before.\n\n```rust\n{}\n```\n\nAfter.", body.join("\n"));
        let originals: Vec<&str> = text.lines().collect();
        for (max, overlap) in [(16, 0), (20, 0), (16, 6), (30, 10)] {
            let spec = spec(max, overlap);
            let chunks = chunk(&text, spec);
            assert!(chunks.len() > 2, "{spec:?}");
            check(&text, spec, &chunks);
            for (i, c) in chunks.iter().enumerate() {
                for (n, line) in c.text.lines().enumerate() {
                    // Only an overlap may start inside a line, and then at a word.
                    let whole = originals.contains(&line);
                    let overlap_start = i > 0 && n == 0 && originals.iter().any(|o| o.ends_with(line));
                    assert!(whole || overlap_start, "{spec:?}: {line:?} in {c:?}");
                }
            }
        }
    }

    #[test]
    fn hash_lines_inside_a_fence_are_not_headings() {
        let (lines, blocks) = parse("# Title\n\n```sh\n# comment\n\necho\n```\ntail\n\nnext");
        let sticky: Vec<&str> = lines.iter().filter(|l| l.sticky).map(|l| l.text).collect();
        assert_eq!(sticky, ["# Title"]);
        assert_eq!(blocks, [0..7, 7..8]);
        assert!(!is_heading("#hashtag"));
        assert!(is_heading("###### six"));
        assert!(!is_heading("####### seven"));
    }

    #[test]
    fn heading_never_ends_a_chunk_when_text_follows() {
        let text = (0..12)
            .map(|i| format!("# Section {i}\n\nBody {i} of the section, long enough to matter."))
            .collect::<Vec<_>>()
            .join("\n\nFiller paragraph between sections.\n\n");
        for max in 16..60 {
            for overlap in [0, max / 4] {
                let spec = spec(max, overlap);
                let chunks = chunk(&text, spec);
                check(&text, spec, &chunks);
                for c in &chunks[..chunks.len() - 1] {
                    let last = c.text.lines().last().unwrap();
                    assert!(!is_heading(last), "{spec:?}: {c:?}");
                }
            }
        }
    }

    /// Paragraphs of unique words, one word per number.
    fn numbered_paragraphs(count: usize, words_each: usize) -> String {
        (0..count)
            .map(|p| (0..words_each).map(|w| format!("w{}", p * words_each + w)).collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
            .join("\n\n")
    }

    #[test]
    fn overlap_repeats_the_tail_of_the_previous_chunk() {
        let text = numbered_paragraphs(30, 9);
        let spec = spec(20, 5);
        let chunks = chunk(&text, spec);
        assert!(chunks.len() > 5);
        check(&text, spec, &chunks);
        for pair in chunks.windows(2) {
            let overlap = overlap_len(&pair[0].text, &pair[1].text);
            assert!(overlap > 0 && overlap <= 20, "{pair:?}");
            // About the asked size: within one word of it.
            assert!(overlap > 20 - 8, "{pair:?}");
        }
    }

    #[test]
    fn no_overlap_when_zero() {
        let text = numbered_paragraphs(30, 9);
        let chunks = chunk(&text, spec(20, 0));
        check(&text, spec(20, 0), &chunks);
        for pair in chunks.windows(2) {
            let first = words(&pair[1].text)[0];
            assert!(!words(&pair[0].text).contains(&first), "{pair:?}");
        }
    }

    #[test]
    fn giant_line_is_cut_at_whitespace() {
        let text = (0..300).map(|i| format!("tok{i}")).collect::<Vec<_>>().join(" ");
        for overlap in [0, 3] {
            let spec = spec(10, overlap);
            let chunks = chunk(&text, spec);
            assert!(chunks.len() > 20);
            // `check` rebuilds the words, so none was cut inside.
            check(&text, spec, &chunks);
            for c in &chunks {
                assert_eq!(c.text, c.text.trim(), "{c:?}");
            }
        }
    }

    #[test]
    fn heading_stays_with_a_giant_line() {
        let giant = (0..100).map(|i| format!("tok{i}")).collect::<Vec<_>>().join(" ");
        let text = format!("Intro.\n\n## Heading\n{giant}");
        let chunks = chunk(&text, spec(12, 2));
        check(&text, spec(12, 2), &chunks);
        let with_heading = chunks.iter().find(|c| c.text.contains("## Heading")).unwrap();
        assert!(with_heading.text.contains("## Heading\ntok0"), "{chunks:#?}");
    }

    const UNICODE: &str = "日本語の文章です 漢字 かな\n\nÜnïcödé wörds ärë hérè\n\n\
        🎉🎊 emoji 👩‍👩‍👧 family ✓\n\n# Überschrift\n\nКириллица тоже работает\n\n\
        ```\nコード 🦀\n\n🦀 コード\n```";

    #[test]
    fn unicode_with_tiny_limits_does_not_panic_and_keeps_every_word() {
        for max in 1..8 {
            for overlap in 0..max {
                let spec = spec(max, overlap);
                let chunks = chunk(UNICODE, spec);
                for c in &chunks {
                    assert!(c.tokens <= max && c.tokens == estimate_tokens(&c.text));
                }
                for word in words(UNICODE).into_iter().filter(|w| w.len() <= max * 4) {
                    assert!(chunks.iter().any(|c| c.text.contains(word)), "{spec:?} {word}");
                }
                if overlap == 0 {
                    // Nothing lost or repeated: only whitespace differs.
                    let squeeze = |s: &str| s.split_whitespace().collect::<String>();
                    let joined: String = chunks.iter().map(|c| squeeze(&c.text)).collect();
                    assert_eq!(joined, squeeze(UNICODE), "{spec:?}");
                }
            }
        }
    }

    #[test]
    fn unbroken_multibyte_line_is_cut_between_chars() {
        let text = "日本語🦀".repeat(50);
        let chunks = chunk(&text, spec(1, 0));
        assert!(chunks.iter().all(|c| c.tokens == 1));
        assert_eq!(chunks.iter().map(|c| c.text.as_str()).collect::<String>(), text);
    }

    /// A deterministic document mixing paragraphs, wrapped lines, headings, fences with blank
    /// lines, long lines and multi-byte words, every word unique.
    fn generated(seed: u64) -> String {
        let mut state = seed;
        let mut next = |n: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        let mut id = 0;
        let mut word = |next: &mut dyn FnMut(u64) -> u64| {
            id += 1;
            match next(5) {
                0 => format!("ü{id}"),
                1 => format!("日本{id}"),
                2 => format!("🦀{id}"),
                _ => format!("w{id}"),
            }
        };
        let mut blocks = Vec::new();
        for _ in 0..60 {
            let block = match next(6) {
                0 => format!("## {} {}", word(&mut next), word(&mut next)),
                1 => {
                    let lines: Vec<String> = (0..next(12) + 2)
                        .map(|_| match next(4) {
                            0 => String::new(),
                            _ => format!("let {} = {};", word(&mut next), word(&mut next)),
                        })
                        .collect();
                    format!("```rust\n{}\n```", lines.join("\n"))
                }
                2 => (0..next(80) + 20).map(|_| word(&mut next)).collect::<Vec<_>>().join(" "),
                _ => (0..next(4) + 1)
                    .map(|_| (0..next(7) + 1).map(|_| word(&mut next)).collect::<Vec<_>>().join(" "))
                    .collect::<Vec<_>>()
                    .join("\n"),
            };
            blocks.push(block);
        }
        blocks.join("\n\n")
    }

    /// Bytes of the run of headings around line `at` plus the line after them, as one block.
    fn heading_run_len(lines: &[&str], at: usize) -> usize {
        let nonblank = |l: &&&str| !l.is_empty();
        let before = lines[..at].iter().rev().filter(nonblank);
        let after = lines[at + 1..].iter().filter(nonblank);
        let run = before.take_while(|l| is_heading(l)).map(|l| l.len() + 2);
        let mut rest = after.map(|l| (l.len() + 2, is_heading(l)));
        let mut need = lines[at].len() + run.sum::<usize>();
        for (len, heading) in rest.by_ref() {
            need += len;
            if !heading {
                break;
            }
        }
        need
    }

    #[test]
    fn invariants_hold_across_limits() {
        for seed in 1..4 {
            let text = generated(seed);
            let originals: Vec<&str> = text.lines().collect();
            for max in [16, 23, 40, 64, 200, 1000] {
                for overlap in [0, 1, max / 8, max / 3, max - 1] {
                    let spec = spec(max, overlap);
                    let chunks = chunk(&text, spec);
                    check(&text, spec, &chunks);
                    // Generated words are at most 13 bytes, so 4 tokens always hold one.
                    if overlap >= 4 && chunks.len() > 1 {
                        let overlapping = chunks.windows(2).filter(|p| overlap_len(&p[0].text, &p[1].text) > 0).count();
                        assert!(overlapping > 0, "{spec:?}: no overlap at all");
                    }
                    // A chunk ends on a heading only if its run of headings and the line after
                    // them cannot share one chunk.
                    for c in &chunks[..chunks.len() - 1] {
                        let last = c.text.lines().last().unwrap();
                        if is_heading(last) {
                            let at = originals.iter().position(|l| *l == last).unwrap();
                            let need = heading_run_len(&originals, at);
                            assert!(need > max * BYTES_PER_TOKEN, "{spec:?}: {c:?}");
                        }
                    }
                }
            }
        }
    }

    /// What it proves: a document of about a megabyte comes out whole (every word, in order),
    /// within the limits and with the overlap rules, like the small ones. (It used to be named
    /// "in one pass", which no assertion here can see.)
    #[test]
    fn proof_23_01_a_megabyte_document_is_chunked_whole_within_limits() {
        let text = generated(7).repeat(60); // about a megabyte
        assert!(text.len() > 500_000);
        let spec = spec(256, 32);
        let chunks = chunk(&text, spec);
        check(&text, spec, &chunks);
        assert!(chunks.len() > text.len() / 1024);
    }
}
