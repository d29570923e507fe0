//! The log's SQLite file: one table of calls, written in batches, read newest first.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde_json::Value as Json;

use super::{Entry, Settings};
use crate::types::CallRecord;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS calls (
    seq INTEGER PRIMARY KEY,
    id INTEGER NOT NULL,
    parent INTEGER,
    at_ms INTEGER NOT NULL,
    tool TEXT NOT NULL,
    caller TEXT,
    via TEXT NOT NULL,
    micros INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    message TEXT,
    params TEXT,
    result TEXT,
    truncated INTEGER NOT NULL DEFAULT 0
);
-- No index beside the rowid: entries arrive in time order, so age and --since work from seq
-- (see `prune` and `query`), and each index would cost every write.
DROP INDEX IF EXISTS calls_at;
";

/// Rows bound to one INSERT (12 values each, well under SQLite's 32,766 variables).
const ROWS_PER_INSERT: usize = 64;

fn insert_sql(rows: usize) -> String {
    let values = vec!["(?,?,?,?,?,?,?,?,?,?,?,?)"; rows].join(",");
    format!(
        "INSERT INTO calls (id, parent, at_ms, tool, caller, via, micros, outcome, message, params, result, truncated) VALUES {values}"
    )
}

/// Binds `entries` to the parameters of an [`insert_sql`] statement made for that many rows:
/// the tool name and the error message cut, the message redacted.
fn bind(
    statement: &mut rusqlite::CachedStatement<'_>,
    entries: &[Box<Entry>],
    settings: &Settings,
) -> Result<(), rusqlite::Error> {
    let mut at = 0;
    let mut next = || {
        at += 1;
        at
    };
    for e in entries {
        let truncated = e.params.cut || (e.has_result && e.result.cut);
        let at_ms = e.at.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
        let message = e
            .message
            .as_ref()
            .map(|m| cut(&crate::config::redact::string(m.clone()), settings.max_value_bytes).into_owned());
        statement.raw_bind_parameter(next(), e.id as i64)?;
        statement.raw_bind_parameter(next(), e.parent.map(|p| p as i64))?;
        statement.raw_bind_parameter(next(), at_ms)?;
        statement.raw_bind_parameter(next(), cut(&e.tool, crate::contract::MAX_NAME_BYTES))?;
        statement.raw_bind_parameter(next(), (!e.caller.is_empty()).then_some(e.caller.as_str()))?;
        statement.raw_bind_parameter(next(), e.via)?;
        statement.raw_bind_parameter(next(), e.micros as i64)?;
        statement.raw_bind_parameter(next(), e.outcome)?;
        statement.raw_bind_parameter(next(), message)?;
        statement.raw_bind_parameter(next(), &e.params.text)?;
        statement.raw_bind_parameter(next(), e.has_result.then_some(e.result.text.as_str()))?;
        statement.raw_bind_parameter(next(), truncated)?;
    }
    Ok(())
}

/// `text`, or its first `max` bytes (on a char boundary) with a note of its length.
fn cut(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}… [cut: {} bytes in all]", &text[..end], text.len()))
}

/// What `ctx log` and `GET /calls` ask for.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub tool: Option<String>,
    pub caller: Option<String>,
    /// Entries that started at or after this time.
    pub since: Option<SystemTime>,
    pub errors_only: bool,
    /// Entries before this `seq` (the next page).
    pub before: Option<i64>,
    /// Entries after this `seq`, oldest first (following).
    pub after: Option<i64>,
    pub limit: usize,
}

/// One connection to the log file.
pub struct Store {
    conn: Connection,
}

impl Store {
    /// Opens (creating if needed) the log at `path`.
    pub fn open(path: &Path) -> Result<Store, rusqlite::Error> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            let _ = std::fs::create_dir_all(parent);
        }
        let conn = Connection::open(path)?;
        Store::setup(conn)
    }

    /// Opens an existing log to read it: `None` when there is no file yet.
    pub fn open_existing(path: &Path) -> Result<Option<Store>, rusqlite::Error> {
        if !path.exists() {
            return Ok(None);
        }
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
        Store::setup(conn).map(Some)
    }

    fn setup(conn: Connection) -> Result<Store, rusqlite::Error> {
        conn.busy_timeout(Duration::from_secs(10))?;
        // WAL with NORMAL: a committed batch survives a crash of the process (not of the OS,
        // which is the trade every WAL database here makes).
        // WAL, and no fsync: a committed batch survives the process being killed (the OS has
        // it), which is what the log promises; an OS crash may lose its last seconds. Syncing
        // cost the server more CPU than the inserts themselves.
        conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;")?;
        conn.execute_batch(SCHEMA)?;
        Ok(Store { conn })
    }

    /// Writes `entries` in one transaction, [`ROWS_PER_INSERT`] to a statement (fewer statement
    /// steps; its effect on the writer's CPU was within the noise of the ops bench).
    pub fn insert(&mut self, entries: &[Box<Entry>], settings: &Settings) -> Result<(), rusqlite::Error> {
        let tx = self.conn.transaction()?;
        {
            let mut chunks = entries.chunks_exact(ROWS_PER_INSERT);
            // Static: immutable, SQL text built from constants.
            static MANY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
            let mut many = tx.prepare_cached(MANY.get_or_init(|| insert_sql(ROWS_PER_INSERT)))?;
            for chunk in &mut chunks {
                bind(&mut many, chunk, settings)?;
                many.raw_execute()?;
            }
            // Static: immutable, SQL text built from constants.
            static ONE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
            let mut one = tx.prepare_cached(ONE.get_or_init(|| insert_sql(1)))?;
            for entry in chunks.remainder() {
                bind(&mut one, std::slice::from_ref(entry), settings)?;
                one.raw_execute()?;
            }
        }
        tx.commit()
    }

    /// Deletes entries older than `max_age`, then the oldest beyond `max_entries`.
    /// One small write (the header's user version, set to what it is): whether the file takes
    /// writes again after a failed one.
    pub fn probe(&mut self) -> Result<(), rusqlite::Error> {
        let version: i64 = self.conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
        self.conn.execute_batch(&format!("PRAGMA user_version = {version}"))
    }

    pub fn prune(&mut self, max_age: Duration, max_entries: u64) -> Result<usize, rusqlite::Error> {
        let cutoff = SystemTime::now()
            .checked_sub(max_age)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        // Entries are written in about the order they start, so the oldest ones are the lowest
        // seqs: delete up to the newest entry that is too old.
        let last_old: Option<i64> =
            self.conn.query_row("SELECT MAX(seq) FROM calls WHERE at_ms < ?1", [cutoff], |r| r.get(0))?;
        let mut deleted = match last_old {
            Some(seq) => self.conn.execute("DELETE FROM calls WHERE seq <= ?1", [seq])?,
            None => 0,
        };
        let newest: Option<i64> = self.conn.query_row("SELECT MAX(seq) FROM calls", [], |r| r.get(0))?;
        if let Some(newest) = newest {
            let keep_from = newest - max_entries as i64;
            deleted += self.conn.execute("DELETE FROM calls WHERE seq <= ?1", [keep_from])?;
        }
        Ok(deleted)
    }

    /// The entries that match `filter`: newest first, or oldest first with `after`.
    pub fn query(&self, filter: &Filter) -> Result<Vec<CallRecord>, rusqlite::Error> {
        let since_ms = filter.since.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_millis() as i64);
        let order = if filter.after.is_some() { "ASC" } else { "DESC" };
        let sql = format!(
            "SELECT seq, id, parent, at_ms, tool, caller, via, micros, outcome, message, params, result, truncated
             FROM calls
             WHERE (?1 IS NULL OR tool = ?1) AND (?2 IS NULL OR caller = ?2) AND (?3 IS NULL OR at_ms >= ?3)
               AND (?4 = 0 OR outcome != 'ok') AND (?5 IS NULL OR seq < ?5) AND (?6 IS NULL OR seq > ?6)
             ORDER BY seq {order} LIMIT ?7"
        );
        let mut statement = self.conn.prepare_cached(&sql)?;
        let rows = statement.query_map(
            params![
                filter.tool,
                filter.caller,
                since_ms,
                filter.errors_only,
                filter.before,
                filter.after,
                filter.limit as i64
            ],
            record,
        )?;
        rows.collect()
    }

    /// How many entries the log holds.
    pub fn count(&self) -> Result<u64, rusqlite::Error> {
        self.conn.query_row("SELECT COUNT(*) FROM calls", [], |r| r.get::<_, i64>(0)).map(|n| n as u64)
    }

    /// The newest entry's `seq`, if any.
    pub fn newest(&self) -> Result<Option<i64>, rusqlite::Error> {
        self.conn.query_row("SELECT MAX(seq) FROM calls", [], |r| r.get(0)).optional().map(Option::flatten)
    }
}

fn record(row: &rusqlite::Row<'_>) -> Result<CallRecord, rusqlite::Error> {
    let json = |text: Option<String>| text.map(|t| serde_json::from_str(&t).unwrap_or(Json::String(t)));
    let at_ms: i64 = row.get(3)?;
    let at = chrono::DateTime::from_timestamp_millis(at_ms).unwrap_or_default();
    Ok(CallRecord {
        seq: row.get(0)?,
        id: row.get(1)?,
        parent: row.get(2)?,
        at,
        tool: row.get(4)?,
        caller: row.get(5)?,
        via: row.get(6)?,
        ms: row.get::<_, i64>(7)? as f64 / 1000.0,
        outcome: row.get(8)?,
        message: row.get(9)?,
        params: json(row.get(10)?),
        result: json(row.get(11)?),
        truncated: row.get(12)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(id: u64, tool: &str, outcome: &'static str, at: SystemTime) -> Box<Entry> {
        Box::new(Entry {
            id,
            parent: None,
            at,
            tool: tool.into(),
            caller: "ci".into(),
            via: "rest",
            micros: 1500,
            outcome,
            message: None,
            params: super::super::Rendered { text: json!({"q": id}).to_string(), cut: false },
            result: super::super::Rendered { text: json!({"ok": true}).to_string(), cut: false },
            has_result: true,
            ..Entry::default()
        })
    }

    #[test]
    fn batches_of_many_statements_and_a_remainder_all_land_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("calls.sqlite");
        let mut store = Store::open(&path).unwrap();
        let settings = Settings {
            path,
            max_age: Duration::from_secs(3600),
            max_entries: 1000,
            max_value_bytes: 16,
            redact: Vec::new(),
        };
        let now = SystemTime::now();
        let mut rows: Vec<Box<Entry>> =
            (1..=ROWS_PER_INSERT as u64 * 2 + 5).map(|id| entry(id, "echo", "ok", now)).collect();
        rows[70].message = Some("a message longer than sixteen bytes".into());
        rows[70].has_result = false;
        rows[70].caller.clear();
        store.insert(&rows, &settings).unwrap();
        let all = store.query(&Filter { after: Some(0), limit: 1000, ..Default::default() }).unwrap();
        assert_eq!(all.len(), rows.len());
        assert!(all.iter().zip(1..).all(|(r, id)| r.id == id), "ids out of order");
        let cut = &all[70];
        assert_eq!(cut.message.as_deref(), Some("a message longer… [cut: 35 bytes in all]"));
        assert_eq!((cut.result.clone(), cut.caller.clone()), (None, None));
        assert_eq!(all[71].caller.as_deref(), Some("ci"));
    }

    #[test]
    fn written_rows_read_back_newest_first_with_filters_and_retention() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("calls.sqlite")).unwrap();
        let settings = Settings {
            path: dir.path().join("calls.sqlite"),
            max_age: Duration::from_secs(3600),
            max_entries: 3,
            max_value_bytes: 4096,
            redact: Vec::new(),
        };
        let now = SystemTime::now();
        let old = now - Duration::from_secs(7200);
        let rows = [
            entry(1, "search", "ok", old),
            entry(2, "search", "ok", now),
            entry(3, "echo", "bad_request", now),
            entry(4, "echo", "ok", now),
            entry(5, "search", "ok", now),
        ];
        store.insert(&rows, &settings).unwrap();
        let all = store.query(&Filter { limit: 10, ..Default::default() }).unwrap();
        assert_eq!(all.iter().map(|r| r.id).collect::<Vec<_>>(), [5, 4, 3, 2, 1]);
        assert_eq!(all[0].params, Some(json!({"q": 5})));
        assert_eq!(all[0].ms, 1.5);
        let errors = store.query(&Filter { errors_only: true, limit: 10, ..Default::default() }).unwrap();
        assert_eq!(errors.iter().map(|r| r.id).collect::<Vec<_>>(), [3]);
        let echo = store.query(&Filter { tool: Some("echo".into()), limit: 10, ..Default::default() }).unwrap();
        assert_eq!(echo.len(), 2);
        let recent =
            store.query(&Filter { since: Some(now - Duration::from_secs(60)), limit: 10, ..Default::default() });
        assert_eq!(recent.unwrap().len(), 4);
        let followed = store.query(&Filter { after: Some(3), limit: 10, ..Default::default() }).unwrap();
        assert_eq!(followed.iter().map(|r| r.id).collect::<Vec<_>>(), [4, 5]);
        // The one older than an hour goes by age, then the oldest beyond three by count.
        assert_eq!(store.prune(Duration::from_secs(3600), 3).unwrap(), 2);
        let left = store.query(&Filter { limit: 10, ..Default::default() }).unwrap();
        assert_eq!(left.iter().map(|r| r.id).collect::<Vec<_>>(), [5, 4, 3]);
    }
}
