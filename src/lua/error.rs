//! Errors of the Lua layer: which limit was hit, or what the script did wrong, sanitised.

use std::time::Duration;

use serde_json::Value as Json;

use crate::contract::text::seconds;
use crate::contract::CallError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ScriptError {
    /// The script file could not be read.
    #[error("cannot read script {path}: {message}")]
    Unreadable { path: String, message: String },
    /// A syntax error or an error raised while loading the script.
    #[error("{message}")]
    Load { message: String, detail: String },
    /// The script does not follow the contract (no `tool` table, `execute` not a function, ...).
    #[error("{path}: {message}")]
    Contract { path: String, message: String },
    /// A Lua error raised while running: the message has the script-relative path and line.
    #[error("{message}")]
    Runtime { message: String, detail: String },
    /// `error({code = "...", message = "..."})`: the table's `message`, its `code` when it is a
    /// string, and the table itself as JSON (bounded by [`ScriptError::RAISED_DATA_CAP`]).
    #[error("{message}")]
    Raised { message: String, code: Option<String>, data: Json },
    #[error("{what} timed out after {}", seconds(limit))]
    Timeout { what: String, limit: Duration },
    #[error("{what} exceeded its memory limit of {} MiB", limit_bytes / (1024 * 1024))]
    Memory { what: String, limit_bytes: usize },
    #[error("{what} returned {size} bytes of JSON, over its max_result_bytes limit of {limit}")]
    ResultTooLarge { what: String, size: usize, limit: usize },
    #[error("{what} returned a value that is not JSON: {message}")]
    BadResult { what: String, message: String },
    #[error("{what} was cancelled: its caller cancelled it or went away")]
    Cancelled { what: String },
    /// A code-mode script executed its whole instruction budget.
    #[error("{what} executed its limit of {limit} Lua instructions")]
    Instructions { what: String, limit: u64 },
}

impl ScriptError {
    /// The most bytes of an error message that a script's error can put in a reply or a log line.
    pub const MESSAGE_CAP: usize = 4096;
    /// The most bytes of an error code a script chooses (`MCP.error`, an error table's `code`).
    pub const CODE_CAP: usize = 128;
    /// The most bytes of JSON kept from a table a script raised as its error.
    pub const RAISED_DATA_CAP: usize = 16 * 1024;

    /// The full technical detail (stack traceback, absolute paths) for `--verbose` output and
    /// logs; secrets stay out of it too (see [`crate::config::redact`]).
    pub fn detail(&self) -> String {
        let detail = match self {
            ScriptError::Load { detail, .. } | ScriptError::Runtime { detail, .. } => detail.clone(),
            ScriptError::Raised { message, data, .. } => format!("{message} (raised table: {data})"),
            other => other.to_string(),
        };
        crate::config::redact::string(detail)
    }

    /// `text` cut to at most `cap` bytes at a character boundary, followed by how long it was:
    /// "abc… (truncated, 12345678 bytes)".
    pub fn bounded_text(text: &str, cap: usize) -> String {
        Self::bounded_bytes(text.as_bytes(), cap)
    }

    /// [`ScriptError::bounded_text`] for the bytes of a Lua string, which may not be UTF-8; only
    /// the part kept is decoded.
    pub fn bounded_bytes(bytes: &[u8], cap: usize) -> String {
        if bytes.len() <= cap {
            return String::from_utf8_lossy(bytes).into_owned();
        }
        let mut end = cap;
        // Back up to the start of a UTF-8 sequence, so a character is never split.
        while end > 0 && (bytes[end] & 0b1100_0000) == 0b1000_0000 {
            end -= 1;
        }
        format!("{}… (truncated, {} bytes)", String::from_utf8_lossy(&bytes[..end]), bytes.len())
    }

    /// The same error with its script-chosen text cut to `cap` bytes (detail to twice that), so
    /// that no script can make a reply or a log line as long as it likes. Text already cut to
    /// `cap` (it is a little longer, by what the cut appended) keeps the size it reports.
    pub fn bounded(self, cap: usize) -> ScriptError {
        let cut = |text: String, cap: usize| {
            if text.len() <= cap + CUT_NOTE_ROOM {
                text
            } else {
                Self::bounded_text(&text, cap)
            }
        };
        match self {
            ScriptError::Load { message, detail } => {
                ScriptError::Load { message: cut(message, cap), detail: cut(detail, cap * 2) }
            }
            ScriptError::Runtime { message, detail } => {
                ScriptError::Runtime { message: cut(message, cap), detail: cut(detail, cap * 2) }
            }
            ScriptError::Raised { message, code, data } => ScriptError::Raised {
                message: cut(message, cap),
                code: code.map(|c| cut(c, Self::CODE_CAP.min(cap))),
                data,
            },
            other => other,
        }
    }
}

/// Room for the "… (truncated, N bytes)" that a cut appends.
const CUT_NOTE_ROOM: usize = 48;

/// What a script's failure means for a call: said here, beside [`ScriptError`], since the
/// contract's [`CallError`] knows nothing of scripts.
impl CallError {
    /// Turns a script failure into the call error of `tool`.
    pub fn from_script(tool: &str, err: ScriptError) -> CallError {
        CallError::from_script_of(format!("tool '{tool}'"), err)
    }

    /// Turns a script failure into a call error; `subject` reads "tool 'x'" or "agent 'x'".
    pub fn from_script_of(subject: String, err: ScriptError) -> CallError {
        match err {
            ScriptError::Timeout { limit, .. } => CallError::Timeout { subject, limit },
            ScriptError::Memory { limit_bytes, .. } => CallError::MemoryLimit { subject, limit_bytes },
            ScriptError::Cancelled { .. } => CallError::Cancelled { subject },
            e @ ScriptError::ResultTooLarge { .. } => CallError::ResultTooLarge(e.to_string()),
            ScriptError::Raised { message, code, data } => {
                CallError::ToolFailed { message, tool_code: code, data: Some(data) }
            }
            // Script errors arrive bounded from the Lua layer; this bounds the rest (a contract
            // message quoting a script's text) before it reaches a client or a log line.
            other => CallError::ToolFailed {
                message: ScriptError::bounded_text(&other.to_string(), ScriptError::MESSAGE_CAP),
                tool_code: None,
                data: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_text_keeps_short_text_and_cuts_long_text_at_a_character() {
        assert_eq!(ScriptError::bounded_text("short", 10), "short");
        assert_eq!(ScriptError::bounded_text("abcdefgh", 4), "abcd… (truncated, 8 bytes)");
        // "é" is two bytes: a cut inside it backs up before it.
        assert_eq!(ScriptError::bounded_text("aé", 2), "a… (truncated, 3 bytes)");
        assert_eq!(ScriptError::bounded_bytes(b"ab\xff\xfe", 3), "ab\u{fffd}… (truncated, 4 bytes)");
    }
}
