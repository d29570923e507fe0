//! Errors of the Lua layer: which limit was hit, or what the script did wrong, sanitised.

use std::time::Duration;

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
    #[error("{what} timed out after {}", seconds(limit))]
    Timeout { what: String, limit: Duration },
    #[error("{what} exceeded its memory limit of {} MiB", limit_bytes / (1024 * 1024))]
    Memory { what: String, limit_bytes: usize },
    #[error("{what} returned {size} bytes of JSON, over its max_result_bytes limit of {limit}")]
    ResultTooLarge { what: String, size: usize, limit: usize },
    #[error("{what} returned a value that is not JSON: {message}")]
    BadResult { what: String, message: String },
    #[error("{what} was cancelled: the caller went away")]
    Cancelled { what: String },
}

impl ScriptError {
    /// The full technical detail (stack traceback, absolute paths) for `--verbose` output and
    /// logs; secrets stay out of it too (see [`crate::config::redact`]).
    pub fn detail(&self) -> String {
        let detail = match self {
            ScriptError::Load { detail, .. } | ScriptError::Runtime { detail, .. } => detail.clone(),
            other => other.to_string(),
        };
        crate::config::redact::string(detail)
    }
}

/// "1 second", "30 seconds", "2.5 seconds": how limits read in messages.
pub(crate) fn seconds(d: &Duration) -> String {
    let secs = d.as_secs_f64();
    if secs == 1.0 {
        "1 second".to_string()
    } else if secs.fract() == 0.0 {
        format!("{} seconds", secs as u64)
    } else {
        format!("{secs:.1} seconds")
    }
}
