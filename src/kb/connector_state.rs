//! What a script connector keeps between syncs: when its last successful sync started, and the
//! small key-value state its script saved with `context.state.set` (a cursor such as "issues
//! updated since ..."). One row per source.
//!
//! The row is written by the sync's own transaction ([`super::store::Change::SourceSynced`]), so
//! it changes exactly when the sync's documents do: a failed or stopped sync keeps the last good
//! state, and the next sync asks again for what this one did not get.

use rusqlite::{params, OptionalExtension};
use serde_json::{Map, Value};

use super::KbError;

/// The table, created by the store's third migration.
pub(super) const DDL: &str = r#"
CREATE TABLE connector_state (
    source       TEXT PRIMARY KEY,
    last_success TEXT NOT NULL,
    state_json   TEXT NOT NULL DEFAULT '{}'
);
"#;

// What is saved and its bounds are the connectors' (a script sets them); the SQL is here.
pub use crate::connectors::state::{Saved, MAX_BYTES, MAX_KEY_BYTES};

pub(super) fn load(conn: &rusqlite::Connection, source: &str) -> Result<Saved, KbError> {
    let row: Option<(String, String)> = conn
        .prepare_cached("SELECT last_success, state_json FROM connector_state WHERE source = ?1")?
        .query_row([source], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((last_success, state)) = row else { return Ok(Saved::default()) };
    // Only ctx writes this column; a row that does not parse (edited by hand) starts afresh
    // rather than stopping every sync of the source.
    let values = match serde_json::from_str(&state) {
        Ok(Value::Object(map)) => map,
        _ => {
            tracing::warn!(source, "the saved connector state is not a JSON object; starting with an empty state");
            Map::new()
        }
    };
    Ok(Saved { last_success: Some(last_success), values })
}

/// Records a successful sync that started at `started_at`, with the script's new state, or the
/// state it had when `values` is `None` (the script changed nothing).
pub(super) fn save(
    tx: &rusqlite::Connection,
    source: &str,
    started_at: &str,
    values: Option<&Map<String, Value>>,
) -> Result<(), KbError> {
    let state = values.map(|v| Value::Object(v.clone()).to_string());
    tx.prepare_cached(
        "INSERT INTO connector_state (source, last_success, state_json) VALUES (?1, ?2, COALESCE(?3, '{}'))
         ON CONFLICT (source) DO UPDATE SET last_success = excluded.last_success,
             state_json = COALESCE(?3, connector_state.state_json)",
    )?
    .execute(params![source, started_at, state])?;
    Ok(())
}
