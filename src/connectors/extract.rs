//! From a file's bytes to what its document indexes: gzip unpacked, binary refused, a UTF-8 byte
//! order mark dropped, HTML made text, Markdown front matter made metadata, and the title chosen. Both file connectors (filesystem and
//! git) call [`extract`], so a file reads the same from a folder as from a repository.

use std::io::Read;

use super::{content_type_for, decode_lossy, html, looks_binary, title_for, SkipReason};

/// A file's text, ready to become an [`super::Item`].
#[derive(Debug, PartialEq)]
pub struct Extracted {
    pub title: String,
    pub body: String,
    /// What the file is (`text/html` for a page, even though the body is its text).
    pub content_type: &'static str,
    /// Whether invalid UTF-8 was replaced.
    pub lossy: bool,
    /// A Markdown file's front matter, which is not in `body` (see [`super::front_matter`]).
    pub front_matter: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Reads a file found at `path` (relative to its source; the fallback title). `limit` is the
/// source's `max_file_bytes`, which also caps what a compressed file may unpack to.
pub fn extract(path: &str, bytes: Vec<u8>, limit: u64) -> Result<Extracted, SkipReason> {
    // `guide/changelog.gz` is the text of `guide/changelog`: its name gives type and title.
    let (name, mut bytes) = match gzip_inner(path) {
        Some(inner) => (inner, gunzip(&bytes, limit)?),
        None => (path, bytes),
    };
    if looks_binary(&bytes) {
        return Err(SkipReason::Binary);
    }
    // A BOM left in would hide front matter and a first `# ` heading, and glue itself to the
    // first word in the index.
    if bytes.starts_with(BOM) {
        bytes.drain(..BOM.len());
    }
    let (text, lossy) = decode_lossy(bytes);
    let content_type = content_type_for(name);
    if content_type == "text/html" {
        let page = html::to_text(&text);
        // A `.html` file without a single tag is plain text: keep its lines as they are.
        if page.tags > 0 {
            let title = page.title.or(page.first_h1).unwrap_or_else(|| name.to_string());
            // The body stored is the page's text, not its markup: snippets, `ctx get` and agents
            // read the body, and they need what a reader of the page sees.
            return Ok(Extracted { title, body: page.text, content_type, lossy, front_matter: None });
        }
    }
    if content_type == "text/markdown" {
        if let Some((front, body)) = super::front_matter::split(&text) {
            let title = front.get("title").and_then(|t| t.as_str()).map(str::trim).filter(|t| !t.is_empty());
            let title = title.map_or_else(|| title_for(name, body, content_type), str::to_string);
            return Ok(Extracted { title, body: body.to_string(), content_type, lossy, front_matter: Some(front) });
        }
    }
    Ok(Extracted { title: title_for(name, &text, content_type), body: text, content_type, lossy, front_matter: None })
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The name inside a `.gz` file, if `path` is one.
fn gzip_inner(path: &str) -> Option<&str> {
    let cut = path.len().checked_sub(3)?;
    let (inner, ext) = (path.get(..cut)?, path.get(cut..)?);
    let base = inner.rsplit('/').next().unwrap_or(inner);
    (ext.eq_ignore_ascii_case(".gz") && !base.is_empty()).then_some(inner)
}

/// Unpacks gzip (several members too, as `gzip` writes for appended files), reading at most one
/// byte past `limit`: a small file that unpacks to gigabytes stops there.
fn gunzip(bytes: &[u8], limit: u64) -> Result<Vec<u8>, SkipReason> {
    let mut out = Vec::new();
    let mut reader = flate2::read::MultiGzDecoder::new(bytes).take(limit.saturating_add(1));
    reader.read_to_end(&mut out).map_err(|e| SkipReason::Unreadable(format!("not valid gzip ({e})")))?;
    if out.len() as u64 > limit {
        return Err(SkipReason::TooLargeUnpacked { limit });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn html_becomes_text_with_its_title() {
        let html = b"<html><head><title>Setup &amp; Use</title><script>secretword()</script></head>\
                     <body><h1>Setup</h1><p>Run <code>make</code>.</p></body></html>";
        let got = extract("guide/setup.html", html.to_vec(), 1000).unwrap();
        assert_eq!(got.title, "Setup & Use");
        assert_eq!(got.body, "# Setup\n\nRun make.\n");
        assert_eq!(got.content_type, "text/html");
        // No <title>: the first <h1>; neither: the path.
        assert_eq!(extract("a.htm", b"<h1>Head</h1>x".to_vec(), 1000).unwrap().title, "Head");
        assert_eq!(extract("a/b.html", b"<p>x</p>".to_vec(), 1000).unwrap().title, "a/b.html");
    }

    #[test]
    fn html_without_tags_stays_plain_text() {
        let got = extract("notes.html", b"line one\n\nline two & more\n".to_vec(), 1000).unwrap();
        assert_eq!(got.body, "line one\n\nline two & more\n");
        assert_eq!((got.title.as_str(), got.content_type), ("notes.html", "text/html"));
    }

    #[test]
    fn gzip_is_read_by_its_inner_name() {
        let got = extract("docs/README.md.gz", gzip(b"# Read me\n\nbody\n"), 1000).unwrap();
        assert_eq!((got.title.as_str(), got.content_type), ("Read me", "text/markdown"));
        assert_eq!(got.body, "# Read me\n\nbody\n");
        let got = extract("guide/changelog.GZ", gzip(b"1.0: first\n"), 1000).unwrap();
        assert_eq!((got.title.as_str(), got.content_type), ("guide/changelog", "text/plain"));
        // Two members, as `gzip -c a b > c.gz` writes.
        let got = extract("two.txt.gz", [gzip(b"one "), gzip(b"two")].concat(), 1000).unwrap();
        assert_eq!(got.body, "one two");
    }

    #[test]
    fn gzip_bombs_corrupt_and_binary_gzip_are_skipped() {
        let bomb = gzip(&vec![b'a'; 10 * 1024 * 1024]);
        assert!(bomb.len() < 100 * 1024);
        assert_eq!(extract("bomb.txt.gz", bomb, 4096), Err(SkipReason::TooLargeUnpacked { limit: 4096 }));
        // Exactly at the limit is fine.
        assert_eq!(extract("x.txt.gz", gzip(&[b'a'; 4096]), 4096).unwrap().body.len(), 4096);
        let corrupt = extract("bad.gz", b"this is not gzip".to_vec(), 1000);
        assert!(matches!(&corrupt, Err(SkipReason::Unreadable(why)) if why.contains("gzip")), "{corrupt:?}");
        let mut truncated = gzip(b"some text that will be cut off before the end");
        truncated.truncate(truncated.len() / 2);
        assert!(matches!(extract("cut.gz", truncated, 1000), Err(SkipReason::Unreadable(_))));
        assert_eq!(extract("img.png.gz", gzip(b"\x89PNG\0\0"), 1000), Err(SkipReason::Binary));
        // Only the extension counts: a folder named `.gz` or a bare `.gz` is no gzip.
        assert_eq!(gzip_inner("a.gz/readme"), None);
        assert_eq!(gzip_inner("dir/.gz"), None);
        assert_eq!(gzip_inner("gz"), None);
    }

    #[test]
    fn a_bom_is_dropped_before_titles_are_read() {
        let got = extract("a.md", b"\xEF\xBB\xBF---\ntitle: Front\n---\nbody\n".to_vec(), 1000).unwrap();
        assert_eq!((got.title.as_str(), got.body.as_str()), ("Front", "body\n"));
        let got = extract("b.md", b"\xEF\xBB\xBF# Heading\n".to_vec(), 1000).unwrap();
        assert_eq!(got.title, "Heading");
        let got = extract("c.md.gz", gzip(b"\xEF\xBB\xBF# Packed\n"), 1000).unwrap();
        assert_eq!(got.title, "Packed");
        assert!(!got.lossy);
    }
}
