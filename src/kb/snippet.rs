//! Snippets: a window of a chunk around the first query term, with the terms marked « ».
//!
//! Built in Rust from the chunk text instead of with FTS5's `snippet()`, which would run the
//! MATCH a second time over every matching chunk.

/// Words of context in a snippet.
const WINDOW: usize = 32;
/// Words shown before the first hit.
const LEAD: usize = 8;

/// What a snippet marks: a word that is, or starts with, a query term (all lower-case).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mark {
    /// The word itself.
    Word(String),
    /// Any word starting with it (a prefix query).
    Prefix(String),
    /// A word starting with it and at most [`STEM_TAIL`] characters longer: a form of a word
    /// that the index matched by its stem ("rollback" marks "Rollbacks").
    Stem(String),
}

/// The longest ending a stemmer takes off a word ("ication" of "authentication").
const STEM_TAIL: usize = 7;

/// The snippet of `text` for `terms`.
pub fn snippet(text: &str, terms: &[Mark]) -> String {
    // Only the words of the window are collected: while looking for the first hit, keep the
    // last LEAD words, which open the window if the next word is a hit.
    let mut words = Words::new(text);
    let mut window: Vec<(usize, usize)> = Vec::with_capacity(WINDOW);
    let mut before: std::collections::VecDeque<(usize, usize)> = std::collections::VecDeque::with_capacity(LEAD + 1);
    let mut skipped = false;
    let mut found = false;
    for range in words.by_ref() {
        if hit(&text[range.0..range.1], terms) {
            window.extend(before.drain(..));
            window.push(range);
            found = true;
            break;
        }
        before.push_back(range);
        if before.len() > LEAD {
            before.pop_front();
            skipped = true;
        }
    }
    if !found {
        // No hit in the text (the title matched): the snippet is its start.
        words = Words::new(text);
        skipped = false;
    }
    while window.len() < WINDOW {
        match words.next() {
            Some(range) => window.push(range),
            None => break,
        }
    }
    let Some(&(first, _)) = window.first() else { return String::new() };
    let next = words.next();
    let mut out = String::with_capacity(WINDOW * 8);
    if skipped {
        out.push('…');
    }
    let mut cursor = first;
    for &(s, e) in &window {
        collapse_into(&mut out, &text[cursor..s]);
        if hit(&text[s..e], terms) {
            out.push('«');
            out.push_str(&text[s..e]);
            out.push('»');
        } else {
            out.push_str(&text[s..e]);
        }
        cursor = e;
    }
    // Keep closing punctuation, drop trailing whitespace.
    let mut tail = String::new();
    collapse_into(&mut tail, &text[cursor..next.map_or(text.len(), |(s, _)| s)]);
    out.push_str(tail.trim_end());
    if next.is_some() {
        out.push('…');
    }
    out
}

/// Whether `word` is marked by one of the terms (case-insensitively).
fn hit(word: &str, terms: &[Mark]) -> bool {
    let lower;
    let word = if word.bytes().any(|b| !b.is_ascii_lowercase() && !b.is_ascii_digit()) {
        lower = word.to_lowercase();
        lower.as_str()
    } else {
        word
    };
    terms.iter().any(|mark| match mark {
        Mark::Word(t) => word == t,
        Mark::Prefix(t) => word.starts_with(t.as_str()),
        Mark::Stem(t) => word.starts_with(t.as_str()) && word[t.len()..].chars().count() <= STEM_TAIL,
    })
}

/// Byte ranges of the words (letters, digits, marks) of a text, in order.
struct Words<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Words<'a> {
    fn new(text: &'a str) -> Self {
        Words { text, at: 0 }
    }
}

impl Iterator for Words<'_> {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        let rest = &self.text[self.at..];
        let (offset, _) = rest.char_indices().find(|(_, c)| c.is_alphanumeric())?;
        let start = self.at + offset;
        let len = self.text[start..].char_indices().find(|(_, c)| !c.is_alphanumeric()).map(|(i, _)| i);
        let end = len.map_or(self.text.len(), |l| start + l);
        self.at = end;
        Some((start, end))
    }
}

/// Appends `between` with whitespace runs (newlines included) as one space, so a snippet is
/// one line.
fn collapse_into(out: &mut String, between: &str) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(term: &str) -> Mark {
        Mark::Word(term.to_string())
    }

    #[test]
    fn marks_terms_and_windows_around_the_first_hit() {
        let text = "one two three four five six seven eight nine ten Deploy the service.\n\nThen roll back.";
        let s = snippet(text, &[t("deploy"), t("back")]);
        assert_eq!(s, "…three four five six seven eight nine ten «Deploy» the service. Then roll «back».");
    }

    #[test]
    fn prefixes_unicode_and_no_hit() {
        assert_eq!(snippet("Café au lait", &[Mark::Prefix("caf".into())]), "«Café» au lait");
        assert_eq!(snippet("東京 is big", &[t("東京")]), "«東京» is big");
        assert_eq!(snippet("nothing here", &[t("zzz")]), "nothing here");
        assert_eq!(snippet("", &[t("x")]), "");
        assert_eq!(snippet("Straße und STRASSE", &[t("straße")]), "«Straße» und STRASSE");
    }

    #[test]
    fn stems_mark_the_forms_of_a_word() {
        let marks = [t("deploy"), Mark::Stem("deplo".into())];
        assert_eq!(snippet("Deployed, deploying; deploy", &marks), "«Deployed», «deploying»; «deploy»");
        // A stem marks forms of a word, not every word it starts.
        assert_eq!(
            snippet("run runs runtimeconfiguration", &[Mark::Stem("run".into())]),
            "«run» «runs» runtimeconfiguration"
        );
    }

    #[test]
    fn long_texts_are_windowed_on_both_sides() {
        let words: Vec<String> = (0..100).map(|i| format!("w{i}")).collect();
        let text = format!("{} Target {}", words[..50].join(" "), words[50..].join("\n"));
        let s = snippet(&text, &[t("target")]);
        assert!(s.starts_with("…w42 w43"), "{s}");
        assert!(s.contains("w49 «Target» w50"), "{s}");
        assert!(s.ends_with("w72…"), "{s}");
        assert_eq!(s.split(' ').count(), 32);
        // No hit at all (a title match): the start of the text, without a leading ellipsis.
        let s = snippet(&text, &[t("absent")]);
        assert!(s.starts_with("w0 w1") && s.ends_with("w31…"), "{s}");
    }
}
