//! YAML front matter at the top of a Markdown file (`---` … `---`): split from the text that is
//! indexed and read as the document's metadata, so "title: Deploy runbook owner: platform" never
//! shows in a snippet. Only the part of YAML that front matter uses is read: `key: value`, lists
//! (`[a, b]`, or `- a` lines) and `|`/`>` blocks. Values stay text; anything else (a nested
//! mapping) is kept as its raw lines under its key.

use serde_json::{Map, Value};

/// The front matter of `text` as a map, and the text after it. `None` when the text does not
/// start with a front matter block: no `---` first line, no closing `---` (or `...`) line, or a
/// block that is not `key: value` lines (a Markdown rule, not YAML).
pub fn split(text: &str) -> Option<(Map<String, Value>, &str)> {
    let mut lines = lines_with_ends(text);
    let (_, first) = lines.next()?;
    if first.trim_end() != "---" {
        return None;
    }
    let mut inside = Vec::new();
    for (end, line) in lines {
        if matches!(line.trim_end(), "---" | "...") {
            let rest = text[end..].trim_start_matches(['\r', '\n']);
            return Some((parse(&inside)?, rest));
        }
        inside.push(line.trim_end_matches(['\r', '\n']));
    }
    None
}

/// Each line with the byte offset just past it (past its newline).
fn lines_with_ends(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= text.len() {
            return None;
        }
        let end = text[at..].find('\n').map_or(text.len(), |i| at + i + 1);
        let line = &text[at..end];
        at = end;
        Some((end, line))
    })
}

fn parse(lines: &[&str]) -> Option<Map<String, Value>> {
    let mut map = Map::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let (key, value) = key_value(line)?;
        // The lines that belong to this key: indented ones, and `- item` lines under an empty value.
        let mut block = Vec::new();
        while i < lines.len() {
            let next = lines[i];
            let indented = next.starts_with([' ', '\t']) || next.trim().is_empty();
            let item = value.is_empty() && next.starts_with('-');
            if !(indented || item) {
                break;
            }
            block.push(next);
            i += 1;
        }
        while block.last().is_some_and(|l| l.trim().is_empty()) {
            block.pop();
        }
        map.insert(key.to_string(), read_value(value, &block));
    }
    // A block with no key at all (only comments) is not worth keeping apart from the text.
    (!map.is_empty()).then_some(map)
}

/// `key: value` (the value may be empty); `None` for a line that is not one.
fn key_value(line: &str) -> Option<(&str, &str)> {
    if line.starts_with([' ', '\t', '-']) {
        return None;
    }
    let colon = line.find(": ").or_else(|| line.strip_suffix(':').map(str::len))?;
    let key = line[..colon].trim().trim_matches(|c| c == '"' || c == '\'');
    (!key.is_empty()).then(|| (key, line[colon + 1..].trim()))
}

fn read_value(value: &str, block: &[&str]) -> Value {
    let dedented = || {
        let indent = block.iter().filter(|l| !l.trim().is_empty()).map(|l| l.len() - l.trim_start().len()).min();
        let indent = indent.unwrap_or(0);
        block.iter().map(|l| l.get(indent..).unwrap_or("").trim_end()).collect::<Vec<_>>()
    };
    match value {
        "" if !block.is_empty() && block.iter().all(|l| l.trim().is_empty() || l.trim_start().starts_with('-')) => {
            let items = block.iter().map(|l| l.trim()).filter(|l| !l.is_empty());
            Value::Array(items.map(|l| Value::String(scalar(l[1..].trim()))).collect())
        }
        "" => Value::String(dedented().join("\n").trim().to_string()),
        "|" | "|-" | "|+" => Value::String(dedented().join("\n").trim_end().to_string()),
        ">" | ">-" | ">+" => Value::String(dedented().join(" ").split_whitespace().collect::<Vec<_>>().join(" ")),
        flow if flow.starts_with('[') && flow.ends_with(']') => {
            let items = flow[1..flow.len() - 1].split(',').map(str::trim).filter(|s| !s.is_empty());
            Value::Array(items.map(|s| Value::String(scalar(s))).collect())
        }
        plain => Value::String(scalar(plain)),
    }
}

/// A scalar's text: quotes removed, or a plain one's ` # comment` cut off.
fn scalar(text: &str) -> String {
    for quote in ['"', '\''] {
        if let Some(inner) = text.strip_prefix(quote).and_then(|t| t.strip_suffix(quote)) {
            return inner.to_string();
        }
    }
    text.split(" #").next().unwrap_or(text).trim().to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn front_matter_is_split_from_the_text_and_read_as_metadata() {
        let text = "---\ntitle: \"Deploy runbook\"\nowner: platform # the team\ntags: [deploy, 'ops']\naliases:\n  - rollout\n  - release\nsummary: >\n  How we ship\n  safely.\n---\n\n# Deploy\n\nSteps.\n";
        let (front, body) = split(text).unwrap();
        assert_eq!(
            Value::Object(front),
            json!({
                "title": "Deploy runbook",
                "owner": "platform",
                "tags": ["deploy", "ops"],
                "aliases": ["rollout", "release"],
                "summary": "How we ship safely.",
            })
        );
        assert_eq!(body, "# Deploy\n\nSteps.\n");
        // CRLF, `...` as the end, and a list at the key's own indent.
        let (front, body) = split("---\r\ntags:\r\n- a\r\n- b\r\n...\r\nText").unwrap();
        assert_eq!((Value::Object(front), body), (json!({"tags": ["a", "b"]}), "Text"));
    }

    #[test]
    fn a_rule_or_an_unclosed_block_is_not_front_matter() {
        assert!(split("---\nJust a rule, then text.\n---\nMore.\n").is_none());
        assert!(split("---\ntitle: never closed\n\nText.\n").is_none());
        assert!(split("# Title\n---\ntitle: x\n---\n").is_none());
        assert!(split("").is_none());
    }
}
