//! The one-way floors: a top-level module of `src/` uses only modules on lower floors of
//! `src/floors.txt` (tests/it/floors.rs; no dependency, reads the sources at test time).
//! It sees `crate::x` paths anywhere in code (grouped `use crate::{x, y}` too) and `super::`
//! chains that climb out of their top-level module; comments and literals are skipped.
//! Test code counts too: a test of a low module must not reach up either.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[test]
fn every_module_uses_only_lower_floors() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let floors = floors(&std::fs::read_to_string(src.join("floors.txt")).expect("src/floors.txt"));
    let mut unlisted = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = match path.extension() {
            None if path.is_dir() => path.file_name(),
            Some(ext) if ext == "rs" => path.file_stem(),
            _ => None,
        };
        let Some(name) = name.and_then(|n| n.to_str()) else { continue };
        if name != "lib" && name != "main" && !floors.contains_key(name) {
            unlisted.push(name.to_string());
        }
    }
    assert!(unlisted.is_empty(), "top-level modules missing from src/floors.txt: {unlisted:?}");

    let mut wrong = Vec::new();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).unwrap().to_path_buf();
        let module = module_path(&rel);
        let Some(top) = module.first() else { continue }; // lib.rs, main.rs (the binary)
        let Some(&own) = floors.get(top.as_str()) else { continue };
        let code = code_only(&std::fs::read_to_string(&file).unwrap());
        for (line, used) in references(&code, &module) {
            match floors.get(used.as_str()) {
                Some(&floor) if used != *top && floor >= own => {
                    wrong.push(format!("src/{}:{line}: {top} (floor {own}) uses {used} (floor {floor})", rel.display()))
                }
                _ => {}
            }
        }
    }
    assert!(wrong.is_empty(), "imports against src/floors.txt (move the item down, or invert):\n{}", wrong.join("\n"));
}

/// `N: a b c` lines; `#` starts a comment. Each module on one floor only.
fn floors(text: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap().trim();
        let Some((floor, names)) = line.split_once(':') else { continue };
        let floor: u32 = floor.trim().parse().expect("a floor number before ':'");
        for name in names.split_whitespace() {
            assert!(out.insert(name.to_string(), floor).is_none(), "{name} is on two floors");
        }
    }
    out
}

pub(super) fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// `tools/registry.rs` → [tools, registry]; `kb/mod.rs` → [kb]; `lib.rs` → [].
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.with_extension("").iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts == ["lib"] || parts == ["main"] {
        parts.clear();
    }
    parts
}

/// The source with comments, string and char literals blanked (line breaks kept).
pub(super) fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            let end = b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if (b[i] == b'r' || b[i..].starts_with(b"br")) && (i == 0 || !ident(b[i - 1])) && {
            let k = i + if b[i] == b'b' { 2 } else { 1 };
            let hashes = b[k..].iter().take_while(|&&c| c == b'#').count();
            b.get(k + hashes) == Some(&b'"')
        } {
            let k = i + if b[i] == b'b' { 2 } else { 1 };
            let hashes = b[k..].iter().take_while(|&&c| c == b'#').count();
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let body = k + hashes + 1;
            let end = b[body..].windows(close.len()).position(|w| w == close).map_or(b.len(), |p| body + p);
            blank(&mut out, body, end);
            i = end + close.len();
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i + 1, j);
            i = j + 1;
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{1b}'), or a lifetime ('a), which stays.
            if b.get(i + 1) == Some(&b'\\') {
                let end = b[i + 2..].iter().position(|&c| c == b'\'').map_or(b.len(), |p| i + 2 + p);
                blank(&mut out, i + 1, end);
                i = end + 1;
            } else if let Some(c) = src[i + 1..].chars().next() {
                let after = i + 1 + c.len_utf8();
                if b.get(after) == Some(&b'\'') {
                    blank(&mut out, i + 1, after);
                    i = after + 1;
                } else {
                    i += 1;
                }
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).expect("only ASCII bytes were replaced")
}

/// Every top-level module `code` names, with its line: `crate::x`, `crate::{x, y::z}`, and
/// `super::…` chains that climb to the crate root from `module` (plus inline `mod m { }`).
fn references(code: &str, module: &[String]) -> Vec<(usize, String)> {
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let inline = inline_mods(code);
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let boundary = i == 0 || !(ident(b[i - 1]) || b[i - 1] == b'$');
        let mut climbed = None;
        if boundary && word_at(b, i, "crate") {
            climbed = Some(i + 5);
        } else if boundary && word_at(b, i, "super") {
            let depth = module.len() + inline.iter().filter(|(s, e)| *s < i && i < *e).count();
            let (mut j, mut ups) = (i, 0);
            while word_at(b, j, "super") {
                ups += 1;
                j = skip_ws(b, j + 5);
                if !b[j..].starts_with(b"::") {
                    break;
                }
                j = skip_ws(b, j + 2);
            }
            if ups >= depth {
                climbed = Some(j);
            }
            i = j.max(i + 1);
        }
        if let Some(at) = climbed {
            let line = code[..at].matches('\n').count() + 1;
            let mut j = skip_ws(b, at);
            if b[j..].starts_with(b"::") {
                j = skip_ws(b, j + 2);
            }
            if b.get(j) == Some(&b'{') {
                // A group: the first name of each item at depth one.
                let (mut depth, mut first) = (0, true);
                while j < b.len() {
                    match b[j] {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        b',' if depth == 1 => first = true,
                        c if ident(c) && first && depth == 1 => {
                            let end = j + b[j..].iter().take_while(|&&c| ident(c)).count();
                            out.push((line, code[j..end].to_string()));
                            first = false;
                            j = end;
                            continue;
                        }
                        _ => {}
                    }
                    j += 1;
                }
            } else {
                let end = j + b[j..].iter().take_while(|&&c| ident(c)).count();
                if end > j {
                    out.push((line, code[j..end].to_string()));
                }
            }
            i = at.max(i + 1);
            continue;
        }
        i += 1;
    }
    out
}

fn word_at(b: &[u8], i: usize, word: &str) -> bool {
    b[i..].starts_with(word.as_bytes())
        && !b.get(i + word.len()).is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'_')
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The byte ranges of inline modules (`mod tests { … }`).
fn inline_mods(code: &str) -> Vec<(usize, usize)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = code[i..].find("mod ") {
        let at = i + p;
        i = at + 4;
        if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_') {
            continue;
        }
        let name_end = i + b[i..].iter().take_while(|&&c| c.is_ascii_alphanumeric() || c == b'_').count();
        let open = skip_ws(b, name_end);
        if name_end == i || b.get(open) != Some(&b'{') {
            continue;
        }
        let mut depth = 0;
        for (k, &c) in b[open..].iter().enumerate() {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        out.push((open, open + k));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}
