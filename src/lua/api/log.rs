//! `log.debug/info/warn/error` and `print`, to tracing on stderr, tagged with the script.
//!
//! `print` goes to the log too: stdout belongs to the CLI's output and the MCP stdio transport.

use std::sync::Arc;

use mlua::{Lua, MultiValue};

use crate::lua::RunState;

/// The most bytes one log line of a script keeps; the rest is cut, and the line says so.
const LINE_CAP: usize = 4096;

/// The most log lines one run writes; later ones are dropped and counted (see
/// [`RunState::note_log_line`]).
pub(crate) const LINES_PER_RUN: u32 = 1000;

/// The arguments as one line, at most [`LINE_CAP`] bytes of it copied out of Lua. `__tostring`
/// runs script code: its errors (a kill among them) propagate rather than being written around.
fn join(args: &MultiValue) -> mlua::Result<String> {
    let mut line = Vec::new();
    let mut total = 0usize;
    for (i, value) in args.iter().enumerate() {
        let text = match value {
            mlua::Value::String(s) => s.as_bytes().to_vec_capped(LINE_CAP),
            other => other.to_string()?.into_bytes(),
        };
        if i > 0 {
            total += 1;
            if line.len() < LINE_CAP {
                line.push(b' ');
            }
        }
        total += text.len();
        let room = LINE_CAP.saturating_sub(line.len());
        line.extend_from_slice(&text[..text.len().min(room)]);
        if let mlua::Value::String(s) = value {
            total += s.as_bytes().len().saturating_sub(text.len());
        }
    }
    let mut out = one_line(&String::from_utf8_lossy(&line)).into_owned();
    if total > line.len() {
        out.push_str(&format!(" … (truncated, {total} bytes)"));
    }
    Ok(out)
}

/// `text` with its control characters escaped (`\n`, `\r`, `\u{1b}`...): a log line a script
/// wrote (or an error message it raised) stays one line, and cannot pass off a line of its own
/// as the server's.
pub fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    // Control characters (C0, DEL, C1 with NEL), the Unicode line and paragraph separators some
    // log viewers break lines at, and the bidirectional controls that would reorder what a
    // reader sees: embeddings, overrides and isolates, and the marks (LRM, RLM, ALM).
    let breaks = |c: char| {
        c.is_control()
            || matches!(
                c,
                '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}'
            )
    };
    if !text.chars().any(breaks) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if breaks(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Copies at most `cap` bytes.
trait CappedCopy {
    fn to_vec_capped(&self, cap: usize) -> Vec<u8>;
}

impl CappedCopy for [u8] {
    fn to_vec_capped(&self, cap: usize) -> Vec<u8> {
        self[..self.len().min(cap)].to_vec()
    }
}

pub fn register(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    let log = lua.create_table()?;
    // `print` is `log.info` under its own name, so that its errors name it.
    let levels =
        [("debug", "log.debug"), ("info", "log.info"), ("warn", "log.warn"), ("error", "log.error"), ("info", "print")];
    for (level, name) in levels {
        let state = Arc::clone(state);
        let f = super::function(lua, name, move |_, args: MultiValue| {
            state.check_blocking()?;
            if !state.note_log_line() {
                return Ok(());
            }
            let kind = state.info.kind.as_str();
            let name = state.info.name.as_str();
            let text = join(&args)?;
            state.check()?;
            match level {
                "debug" => tracing::debug!(target: "ctx::script", kind, name, "{text}"),
                "info" => tracing::info!(target: "ctx::script", kind, name, "{text}"),
                "warn" => tracing::warn!(target: "ctx::script", kind, name, "{text}"),
                _ => tracing::error!(target: "ctx::script", kind, name, "{text}"),
            }
            Ok(())
        })?;
        if name == "print" {
            lua.globals().set("print", f)?;
        } else {
            log.set(level, f)?;
        }
    }
    lua.globals().set("log", log)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_log_line_stays_one_line() {
        let forged = "hello\n2026-11-28T05:58:22Z ERROR forged\r\u{1b}[2K\tend";
        assert_eq!(one_line(forged), "hello\\n2026-11-28T05:58:22Z ERROR forged\\r\\u{1b}[2K\\tend");
        assert!(matches!(one_line("plain é"), std::borrow::Cow::Borrowed("plain é")));
        assert_eq!(one_line("a\u{85}b\u{2028}c\u{2029}d\u{202e}e"), "a\\u{85}b\\u{2028}c\\u{2029}d\\u{202e}e");
        // The directional marks reorder digits and neutral characters too.
        assert_eq!(one_line("1\u{200e}2\u{200f}3\u{61c}4"), "1\\u{200e}2\\u{200f}3\\u{61c}4");
    }
}
