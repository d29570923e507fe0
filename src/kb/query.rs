//! Turns any user text into a safe FTS5 MATCH expression.
//!
//! User text is never passed to MATCH as written: `NOT`, `AND`, quotes, `-`, `:` and `^` are FTS5
//! syntax. The text is split into terms the way the `unicode61` tokenizer splits it, each term is
//! quoted, and the terms are OR-ed so that BM25 ranks documents matching more terms first. A `*`
//! right after a term keeps it a prefix query, on purpose.

/// The most terms one query may have; more are ignored.
pub const MAX_TERMS: usize = 64;

/// The MATCH expression for `text`, or `None` if it holds no searchable term.
pub fn fts_query(text: &str) -> Option<String> {
    let terms = terms(text);
    if terms.is_empty() {
        return None;
    }
    let parts: Vec<String> =
        terms.iter().map(|(term, prefix)| format!("\"{}\"{}", term, if *prefix { "*" } else { "" })).collect();
    Some(parts.join(" OR "))
}

/// The terms of `text`, each with whether it ends in `*` (a prefix query).
pub fn terms(text: &str) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if is_token_char(c) {
            current.push(c);
            if chars.peek().is_some_and(|n| !is_token_char(*n)) || chars.peek().is_none() {
                let prefix = chars.peek() == Some(&'*');
                let term = std::mem::take(&mut current);
                if !out.iter().any(|(t, p)| *t == term && *p == prefix) {
                    out.push((term, prefix));
                }
                if out.len() == MAX_TERMS {
                    break;
                }
            }
        }
    }
    out
}

/// Letters, digits and marks are token characters for `unicode61`; everything else separates.
/// Quotes never appear inside a term, so quoting cannot be broken out of.
fn is_token_char(c: char) -> bool {
    c.is_alphanumeric() || is_mark(c)
}

fn is_mark(c: char) -> bool {
    matches!(c as u32, 0x0300..=0x036F | 0x1AB0..=0x1AFF | 0x1DC0..=0x1DFF | 0x20D0..=0x20FF | 0xFE20..=0xFE2F)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_and_punctuation_become_plain_terms() {
        assert_eq!(fts_query("NOT").as_deref(), Some("\"NOT\""));
        assert_eq!(fts_query("\"AND OR\"").as_deref(), Some("\"AND\" OR \"OR\""));
        assert_eq!(fts_query("c++").as_deref(), Some("\"c\""));
        assert_eq!(fts_query("foo:bar").as_deref(), Some("\"foo\" OR \"bar\""));
        assert_eq!(fts_query("-x").as_deref(), Some("\"x\""));
        assert_eq!(fts_query("^start NEAR(a b)").as_deref(), Some("\"start\" OR \"NEAR\" OR \"a\" OR \"b\""));
    }

    #[test]
    fn trailing_star_is_a_prefix() {
        assert_eq!(fts_query("depl* roll").as_deref(), Some("\"depl\"* OR \"roll\""));
        assert_eq!(fts_query("*").as_deref(), None);
    }

    #[test]
    fn empty_and_symbol_only_queries_have_no_terms() {
        assert_eq!(fts_query(""), None);
        assert_eq!(fts_query("  \"\" -- ++ "), None);
    }

    #[test]
    fn unicode_terms_survive() {
        assert_eq!(fts_query("café 東京 naïve").as_deref(), Some("\"café\" OR \"東京\" OR \"naïve\""));
    }
}
