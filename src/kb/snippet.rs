//! Snippets: a window of a chunk around the first query term, with the terms marked « ».
//!
//! Built in Rust from the chunk text instead of with FTS5's `snippet()`, which would run the
//! MATCH a second time over every matching chunk.

/// Words of context in a snippet.
const WINDOW: usize = 32;
/// Words shown before the first hit.
const LEAD: usize = 8;

/// The snippet of `text` for `terms` (lower-case; `true` marks a prefix term).
pub fn snippet(text: &str, terms: &[(String, bool)]) -> String {
    let words = words(text);
    if words.is_empty() {
        return String::new();
    }
    let hit = |word: &str| {
        let word = word.to_lowercase();
        terms.iter().any(|(t, prefix)| if *prefix { word.starts_with(t.as_str()) } else { word == *t })
    };
    let first = words.iter().position(|&(s, e)| hit(&text[s..e])).unwrap_or(0);
    let start = first.saturating_sub(LEAD);
    let end = (start + WINDOW).min(words.len());
    let mut out = String::new();
    if start > 0 {
        out.push('…');
    }
    let mut cursor = words[start].0;
    for &(s, e) in &words[start..end] {
        out.push_str(&collapse(&text[cursor..s]));
        if hit(&text[s..e]) {
            out.push('«');
            out.push_str(&text[s..e]);
            out.push('»');
        } else {
            out.push_str(&text[s..e]);
        }
        cursor = e;
    }
    let tail_end = if end < words.len() { words[end].0 } else { text.len() };
    let tail = &text[cursor..tail_end];
    // Keep closing punctuation, drop trailing whitespace.
    out.push_str(collapse(tail).trim_end());
    if end < words.len() {
        out.push('…');
    }
    out
}

/// Byte ranges of the words (letters, digits, marks) of `text`.
fn words(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        let word_char = c.is_alphanumeric();
        match (start, word_char) {
            (None, true) => start = Some(i),
            (Some(s), false) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, text.len()));
    }
    out
}

/// Whitespace runs (newlines included) become one space, so a snippet is one line.
fn collapse(between: &str) -> String {
    let mut out = String::with_capacity(between.len());
    let mut space = false;
    for c in between.chars() {
        if c.is_whitespace() {
            space = true;
        } else {
            if space {
                out.push(' ');
                space = false;
            }
            out.push(c);
        }
    }
    if space {
        out.push(' ');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(term: &str) -> (String, bool) {
        (term.to_string(), false)
    }

    #[test]
    fn marks_terms_and_windows_around_the_first_hit() {
        let text = "one two three four five six seven eight nine ten Deploy the service.\n\nThen roll back.";
        let s = snippet(text, &[t("deploy"), t("back")]);
        assert_eq!(s, "…three four five six seven eight nine ten «Deploy» the service. Then roll «back».");
    }

    #[test]
    fn prefixes_unicode_and_no_hit() {
        assert_eq!(snippet("Café au lait", &[("caf".into(), true)]), "«Café» au lait");
        assert_eq!(snippet("東京 is big", &[t("東京")]), "«東京» is big");
        assert_eq!(snippet("nothing here", &[t("zzz")]), "nothing here");
        assert_eq!(snippet("", &[t("x")]), "");
    }
}
