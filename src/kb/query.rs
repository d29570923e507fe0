//! Turns any user text into a safe FTS5 MATCH expression.
//!
//! User text is never passed to MATCH as written: `NOT`, `AND`, quotes, `-`, `:` and `^` are FTS5
//! syntax. The text is split into terms the way the `unicode61` tokenizer splits it and each term
//! is quoted. A `*` right after a term keeps it a prefix query, on purpose.
//!
//! Common English words ("the", "how", "to") are dropped when the query has other terms: they
//! match nearly every chunk, and BM25 must score every match before the top-k cut. Search first
//! asks for all remaining terms (AND); if that finds nothing, it asks for any of them (OR).

/// Words this long or longer are also searched as prefixes when a page is filled.
pub const WIDE_PREFIX: usize = 4;

/// The most terms one query may have; more are ignored.
pub const MAX_TERMS: usize = 64;

/// The MATCH expressions for one query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FtsQuery {
    /// Every term must match.
    pub all: String,
    /// Any term may match; `None` when there is only one term.
    pub any: Option<String>,
    /// Any term may match, and a word of [`WIDE_PREFIX`] or more characters also as the start
    /// of a longer one (`auth` finds "authentication"; with stemming, stems that start with its
    /// stem): what fills a short page. `None` when it is the same as `all`.
    pub wide: Option<String>,
    /// The terms searched for, lower-case, each with whether it is a prefix.
    pub terms: Vec<(String, bool)>,
}

/// The MATCH expressions for `text`, or `None` if it holds no searchable term.
pub fn fts_query(text: &str) -> Option<FtsQuery> {
    fts_query_rooted(text, &mut |t| Ok::<_, std::convert::Infallible>(t.to_string())).unwrap_or_default()
}

/// [`fts_query`], with each prefix term searched as `root(term)` (lower-case). A stemming index
/// stems a prefix query's text too (`deploy*` looks for stems starting with "deploi" and misses
/// "deployment", stored as "deploy"), so the caller passes the longest part the stemmer keeps.
pub fn fts_query_rooted<E>(text: &str, root: &mut dyn FnMut(&str) -> Result<String, E>) -> Result<Option<FtsQuery>, E> {
    let mut terms = terms(text);
    if terms.iter().any(|(t, prefix)| *prefix || !is_stop_word(t)) {
        terms.retain(|(t, prefix)| *prefix || !is_stop_word(t));
    }
    if terms.is_empty() {
        return Ok(None);
    }
    let mut parts = Vec::with_capacity(terms.len());
    let mut wide = Vec::with_capacity(terms.len());
    for (term, prefix) in &terms {
        let mut as_prefix = || root(&term.to_lowercase()).map(|r| format!("\"{r}\"*"));
        let part = if *prefix { as_prefix()? } else { format!("\"{term}\"") };
        // Not by its root: a stemming index stems the text of `"bindings"*` to "bind", so this
        // finds the stems that start with the word's own stem ("binder"), where the root
        // ("bindin") would miss "binding" itself.
        wide.push(if !*prefix && term.chars().count() >= WIDE_PREFIX { format!("\"{term}\"*") } else { part.clone() });
        parts.push(part);
    }
    let wide = wide.join(" OR ");
    let all = parts.join(" AND ");
    Ok(Some(FtsQuery {
        wide: (wide != all).then_some(wide),
        all,
        any: (parts.len() > 1).then(|| parts.join(" OR ")),
        terms: terms.into_iter().map(|(t, prefix)| (t.to_lowercase(), prefix)).collect(),
    }))
}

/// Words too common to narrow a search. Kept short on purpose: only words that carry no topic.
fn is_stop_word(term: &str) -> bool {
    const STOP: &[&str] = &[
        "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from", "how", "i", "in", "is",
        "it", "me", "my", "of", "on", "or", "the", "this", "that", "to", "was", "we", "what", "when", "where", "which",
        "who", "why", "with", "you", "your",
    ];
    term.len() <= 5 && STOP.contains(&term.to_lowercase().as_str())
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

    fn all(text: &str) -> Option<String> {
        fts_query(text).map(|q| q.all)
    }

    #[test]
    fn operators_and_punctuation_become_plain_terms() {
        assert_eq!(all("NOT").as_deref(), Some("\"NOT\""));
        assert_eq!(all("c++").as_deref(), Some("\"c\""));
        assert_eq!(all("foo:bar").as_deref(), Some("\"foo\" AND \"bar\""));
        assert_eq!(all("-x").as_deref(), Some("\"x\""));
        assert_eq!(all("^start NEAR(x y)").as_deref(), Some("\"start\" AND \"NEAR\" AND \"x\" AND \"y\""));
        // Only stop words: they are kept, since nothing else is left to search for.
        let q = fts_query("\"AND OR\"").unwrap();
        assert_eq!(q.all, "\"AND\" AND \"OR\"");
        assert_eq!(q.any.as_deref(), Some("\"AND\" OR \"OR\""));
    }

    #[test]
    fn stop_words_are_dropped_when_other_terms_remain() {
        assert_eq!(all("how do I roll back a deploy").as_deref(), Some("\"roll\" AND \"back\" AND \"deploy\""));
        assert_eq!(fts_query("deploy").unwrap().any, None);
    }

    #[test]
    fn the_wide_query_takes_longer_words_as_prefixes() {
        let q = fts_query("fix auth bug").unwrap();
        assert_eq!(q.all, "\"fix\" AND \"auth\" AND \"bug\"");
        assert_eq!(q.wide.as_deref(), Some("\"fix\" OR \"auth\"* OR \"bug\""));
        assert_eq!(fts_query("auth").unwrap().wide.as_deref(), Some("\"auth\"*"));
        assert_eq!(fts_query("fix").unwrap().wide, None);
    }

    #[test]
    fn trailing_star_is_a_prefix() {
        assert_eq!(all("depl* roll").as_deref(), Some("\"depl\"* AND \"roll\""));
        assert_eq!(all("*"), None);
    }

    #[test]
    fn empty_and_symbol_only_queries_have_no_terms() {
        assert_eq!(all(""), None);
        assert_eq!(all("  \"\" -- ++ "), None);
    }

    #[test]
    fn prefix_terms_are_searched_by_their_root() {
        let q = fts_query_rooted("Deploy* now", &mut |t| Ok::<_, ()>(t[..t.len() - 1].to_string())).unwrap().unwrap();
        assert_eq!(q.all, "\"deplo\"* AND \"now\"");
        assert_eq!(q.wide.as_deref(), Some("\"deplo\"* OR \"now\""));
        // The terms keep what the user typed: snippets mark words that start with it.
        assert_eq!(q.terms, vec![("deploy".to_string(), true), ("now".to_string(), false)]);
    }

    #[test]
    fn unicode_terms_survive() {
        assert_eq!(all("café 東京 naïve").as_deref(), Some("\"café\" AND \"東京\" AND \"naïve\""));
    }
}
