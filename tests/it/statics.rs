//! A static that stays says why: every `static` item and `thread_local!` block in `src/` has a
//! `// Static: ` comment among the comment and attribute lines right above it (no dependency,
//! reads the sources at test time, with the comment and literal blanking of `floors.rs`).
//! Application state is a field of its application (`tools::CallState`); what may stay
//! process-wide is a constant, a cache keyed by its whole input, a per-thread cache or run, or
//! a process-unique id counter, and its comment says which. A `static` inside a `thread_local!`
//! block is covered by the block's comment.

use std::path::Path;

use super::floors::{code_only, rust_files};

#[test]
fn every_static_in_src_says_why_it_may_be_process_wide() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut untagged = Vec::new();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).unwrap().to_path_buf();
        for (line, what) in untagged_statics(&std::fs::read_to_string(&file).unwrap()) {
            untagged.push(format!("src/{}:{line}: {what}", rel.display()));
        }
    }
    assert!(
        untagged.is_empty(),
        "statics without a `// Static: ` comment saying why they may be process-wide (put one right above the \
         declaration; state of an application belongs in its CallState, not in a static):\n{}",
        untagged.join("\n")
    );
}

#[test]
fn the_scan_sees_statics_and_only_statics() {
    let sample = r#"
fn f() -> &'static str { "static X: u8 = 0;" }
impl<T> Trait for &'static T {}
// static COMMENTED: u8 = 0;
/// Doc.
// Static: tagged.
#[allow(dead_code)]
static TAGGED: u8 = 0;
static BARE: u8 = 0;
#[cfg(test)]
// Static: tagged block.
thread_local! {
    static INNER: u8 = 0;
}
thread_local! { static LOOSE: u8 = 0; }
/// Static: a doc comment is not the tag.
pub(crate) static mut MUT: u8 = 0;
// Static: a blank line parts this tag from the static below.

static PARTED: u8 = 0;
"#;
    let found = untagged_statics(sample);
    let expected = [(9, "static BARE"), (15, "thread_local!"), (17, "static MUT"), (20, "static PARTED")];
    assert_eq!(found, expected.map(|(line, what)| (line, what.to_string())));
}

/// The `static` items and `thread_local!` blocks of `text` with no tag above them: their line
/// (from 1) and what they are (`static NAME`, `thread_local!`).
fn untagged_statics(text: &str) -> Vec<(usize, String)> {
    let code = code_only(text);
    let raw: Vec<&str> = text.lines().collect();
    let blanked: Vec<&str> = code.lines().collect();
    let blocks = thread_local_blocks(&code);
    let mut out = Vec::new();
    for (at, what) in declarations(&code) {
        if blocks.iter().any(|&(start, end)| start < at && at < end) {
            continue;
        }
        let line = code[..at].matches('\n').count();
        if !tagged(&raw, &blanked, line) {
            out.push((line + 1, what));
        }
    }
    out
}

/// Whether a `// Static: ` line is among the comment and attribute lines right above `line`.
fn tagged(raw: &[&str], blanked: &[&str], line: usize) -> bool {
    for k in (0..line).rev() {
        let (text, code) = (raw[k].trim(), blanked[k].trim());
        if text.starts_with("// Static: ") {
            return true;
        }
        let comment = code.is_empty() && text.starts_with("//");
        if !comment && !code.starts_with("#[") {
            return false;
        }
    }
    false
}

/// Where each `static NAME:` item and each `thread_local!` starts in `code` (comments and
/// literals blanked; `'static` is a lifetime, not an item).
fn declarations(code: &str) -> Vec<(usize, String)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    for (at, _) in code.match_indices("static") {
        if !boundary(b, at) || at.checked_sub(1).is_some_and(|p| b[p] == b'\'') {
            continue;
        }
        let mut j = skip_ws(b, at + "static".len());
        if j == at + "static".len() {
            continue; // `statics`, or `static` at the end
        }
        if b[j..].starts_with(b"mut") && b.get(j + 3).is_some_and(u8::is_ascii_whitespace) {
            j = skip_ws(b, j + 3);
        }
        let end = j + b[j..].iter().take_while(|&&c| ident(c)).count();
        if end > j && b.get(skip_ws(b, end)) == Some(&b':') {
            out.push((at, format!("static {}", &code[j..end])));
        }
    }
    for (at, _) in code.match_indices("thread_local!") {
        if boundary(b, at) {
            out.push((at, "thread_local!".to_string()));
        }
    }
    out.sort();
    out
}

/// The byte ranges of the bodies of `thread_local!` invocations.
fn thread_local_blocks(code: &str) -> Vec<(usize, usize)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    for (at, _) in code.match_indices("thread_local!") {
        let open = skip_ws(b, at + "thread_local!".len());
        let close = match b.get(open) {
            Some(b'{') => b'}',
            Some(b'(') => b')',
            Some(b'[') => b']',
            _ => continue,
        };
        let (mut depth, mut j) = (0usize, open);
        while j < b.len() {
            if b[j] == b[open] {
                depth += 1;
            } else if b[j] == close {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            j += 1;
        }
        out.push((open, j));
    }
    out
}

fn ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn boundary(b: &[u8], at: usize) -> bool {
    at == 0 || !ident(b[at - 1])
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}
