//! Secrets out of messages: values ctx read from `${VAR}` or from a secret setting never leave
//! the process in an error, a log line, a load problem or a config error.
//!
//! The rule, applied by [`Redactor::add`]:
//! - Every value a `${VAR}` expanded to is a secret, labelled `${VAR}`: ctx cannot tell a token
//!   from a host name, and a URL can carry credentials. Literal values of `server.auth_token`,
//!   `embedding.api_key` and of script keys named like a secret (`token`, `secret`, `password`,
//!   `passwd`, `api_key`, `apikey`, `private_key`, `credential`) are secrets too, labelled with
//!   their key.
//! - A secret is replaced by `[redacted <label>]`, as written and in the encodings a message is
//!   likely to show it in (JSON or Rust string escapes, percent-encoding in a URL).
//! - Values shorter than [`MIN_LEN`] characters are not replaced in free text: `1`, `on` or
//!   `dev` would garble every message that happens to contain them, and so short a value is no
//!   secret worth the name. A config error about a key whose value was expanded never shows
//!   that value, whatever its length (see `Config::from_text`).
//!
//! Secrets are registered process-wide ([`register`]) when a config is read, and stay
//! registered: after a reload the old values are still hidden, which costs nothing.

use std::borrow::Cow;
use std::io::Write;
use std::sync::{Arc, OnceLock, RwLock};

use serde_json::Value as Json;

/// Shorter values are not replaced in free text (see the module docs).
pub const MIN_LEN: usize = 4;

/// Script section keys whose literal values are secrets, matched as substrings of the key name.
const SECRET_KEY_WORDS: &[&str] =
    &["token", "secret", "password", "passwd", "api_key", "apikey", "private_key", "credential"];

/// A set of secrets and what replaces each.
#[derive(Clone, Default)]
pub struct Redactor {
    /// (text to find, replacement), longest first so a secret that contains another goes whole.
    pairs: Vec<(String, String)>,
}

impl std::fmt::Debug for Redactor {
    // Never the values themselves: a Debug dump of a config must not undo the redaction.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} patterns)", self.pairs.len())
    }
}

impl Redactor {
    /// Adds `value`, shown as `[redacted <label>]`, with its usual encodings. Values under
    /// [`MIN_LEN`] characters are skipped.
    pub fn add(&mut self, value: &str, label: &str) {
        if value.trim().chars().count() < MIN_LEN {
            return;
        }
        let replacement = format!("[redacted {label}]");
        for form in encodings(value) {
            if !self.pairs.iter().any(|(needle, _)| *needle == form) {
                self.pairs.push((form, replacement.clone()));
            }
        }
        self.pairs.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    }

    /// Adds every secret of `other`.
    pub fn extend(&mut self, other: &Redactor) {
        for (needle, replacement) in &other.pairs {
            if !self.pairs.iter().any(|(n, _)| n == needle) {
                self.pairs.push((needle.clone(), replacement.clone()));
            }
        }
        self.pairs.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// `text` with every secret replaced.
    pub fn apply<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for (needle, replacement) in &self.pairs {
            if out.contains(needle.as_str()) {
                out = Cow::Owned(out.replace(needle.as_str(), replacement));
            }
        }
        out
    }

    /// Every string inside `value` with every secret replaced.
    pub fn apply_json(&self, value: &mut Json) {
        match value {
            Json::String(s) => {
                if let Cow::Owned(clean) = self.apply(s) {
                    *s = clean;
                }
            }
            Json::Array(items) => items.iter_mut().for_each(|v| self.apply_json(v)),
            Json::Object(map) => map.values_mut().for_each(|v| self.apply_json(v)),
            _ => {}
        }
    }
}

/// True when a script section key holds a secret by its name (`api_token`, `password`, ...).
pub fn is_secret_key(key: &str) -> bool {
    // Without lower-casing a copy: the call log asks this of every key of every call.
    let key = key.as_bytes();
    SECRET_KEY_WORDS.iter().any(|word| key.windows(word.len()).any(|w| w.eq_ignore_ascii_case(word.as_bytes())))
}

/// The value as written and as messages usually quote it: JSON and Rust escapes (`{:?}`), and
/// percent-encoded the way URLs and query strings carry it.
fn encodings(value: &str) -> Vec<String> {
    let mut forms = vec![value.to_string()];
    let json = serde_json::to_string(value).unwrap_or_default();
    let debug = format!("{value:?}");
    for quoted in [json, debug] {
        if let Some(inner) = quoted.strip_prefix('"').and_then(|q| q.strip_suffix('"')) {
            forms.push(inner.to_string());
        }
    }
    forms.push(percent(value, false));
    forms.push(percent(value, true));
    let mut unique: Vec<String> = Vec::new();
    for form in forms {
        if form.chars().count() >= MIN_LEN && !unique.contains(&form) {
            unique.push(form);
        }
    }
    unique
}

/// Percent-encodes every byte outside `A-Z a-z 0-9 - . _ ~`; `form` writes a space as `+` and
/// keeps `*`, as `application/x-www-form-urlencoded` (and so `http`'s `params`) does.
fn percent(value: &str, form: bool) -> String {
    let mut out = String::with_capacity(value.len());
    for &b in value.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(b as char),
            b'*' if form => out.push('*'),
            b' ' if form => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn global() -> &'static RwLock<Arc<Redactor>> {
    // Static: a union of every config's secrets for the one stderr log: over-redacting is harmless, missing one is not.
    static GLOBAL: OnceLock<RwLock<Arc<Redactor>>> = OnceLock::new();
    GLOBAL.get_or_init(Default::default)
}

/// Adds the secrets of a config to the process-wide set used by [`text`].
pub fn register(secrets: &Redactor) {
    if secrets.is_empty() {
        return;
    }
    let mut slot = global().write().unwrap_or_else(|p| p.into_inner());
    let mut merged = Redactor::clone(&slot);
    merged.extend(secrets);
    *slot = Arc::new(merged);
}

/// The process-wide set of secrets.
pub fn current() -> Arc<Redactor> {
    Arc::clone(&global().read().unwrap_or_else(|p| p.into_inner()))
}

/// `text` with every registered secret replaced.
pub fn text(text: &str) -> Cow<'_, str> {
    let secrets = current();
    match secrets.apply(text) {
        Cow::Borrowed(_) => Cow::Borrowed(text),
        Cow::Owned(clean) => Cow::Owned(clean),
    }
}

/// Like [`text`], for an owned message.
pub fn string(message: String) -> String {
    match text(&message) {
        Cow::Borrowed(_) => message,
        Cow::Owned(clean) => clean,
    }
}

/// The log writer: each event is formatted into a buffer and written to stderr, redacted, when
/// the subscriber is done with it (`tracing_subscriber::fmt().with_writer(redact::Stderr)`).
pub struct Stderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Stderr {
    type Writer = Event;
    fn make_writer(&'a self) -> Event {
        Event(Vec::new())
    }
}

/// One log event on its way to stderr.
pub struct Event(Vec<u8>);

impl Write for Event {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let raw = String::from_utf8_lossy(&self.0);
        let _ = std::io::stderr().write_all(text(&raw).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_secrets_in_their_usual_encodings() {
        let mut r = Redactor::default();
        r.add("s3cr3t value/+\"", "${API_KEY}");
        assert_eq!(r.apply("key=s3cr3t value/+\" end"), "key=[redacted ${API_KEY}] end");
        assert_eq!(r.apply("url?key=s3cr3t+value%2F%2B%22"), "url?key=[redacted ${API_KEY}]");
        assert_eq!(r.apply("url?key=s3cr3t%20value%2F%2B%22"), "url?key=[redacted ${API_KEY}]");
        assert_eq!(r.apply(r#"got "s3cr3t value/+\"""#), r#"got "[redacted ${API_KEY}]""#);
    }

    #[test]
    fn short_values_are_left_alone_and_longer_secrets_go_first() {
        let mut r = Redactor::default();
        r.add("on", "${FLAG}");
        r.add("abcd", "${SHORT}");
        r.add("abcdefgh", "${LONG}");
        assert_eq!(r.apply("on abcdefgh abcd"), "on [redacted ${LONG}] [redacted ${SHORT}]");
        assert!(matches!(r.apply("nothing here"), Cow::Borrowed(_)));
        assert_eq!(format!("{r:?}"), "Redactor(2 patterns)");
    }

    #[test]
    fn json_strings_are_redacted_in_place() {
        let mut r = Redactor::default();
        r.add("hunter2-secret", "${PW}");
        let mut v = serde_json::json!({"a": ["x hunter2-secret"], "b": 1});
        r.apply_json(&mut v);
        assert_eq!(v, serde_json::json!({"a": ["x [redacted ${PW}]"], "b": 1}));
    }

    #[test]
    fn secret_key_names() {
        assert!(is_secret_key("api_token") && is_secret_key("Password") && is_secret_key("apikey"));
        assert!(!is_secret_key("url") && !is_secret_key("project"));
    }
}
