//! The log's table of calls, written in batches and read newest first: in a SQLite file beside
//! the knowledge base, or in the shared PostgreSQL database, where every replica's entries meet
//! and each names the replica that served it.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde_json::Value as Json;

use super::{Entry, Settings};
use crate::db::migrate::{Component, Migration};
use crate::db::{DbError, Pg};
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

/// The SQLite file's table. Step 1 is what files made before versioned migrations hold, so it
/// applies to them as a no-op.
// Static: immutable, a store's migrations: SQL text compiled in, the same for every application.
static SQLITE: Component = Component {
    name: "calls",
    migrations: &[Migration { version: 1, name: "the calls", sql: SCHEMA }],
    tables: &["calls"],
};

/// The table in the shared database. Replicas' entries interleave, so they are read in time
/// order (the index on `at_ms, seq`), not in the order they were committed alone.
// Static: immutable, a store's migrations: SQL text compiled in, the same for every application.
pub static PG: Component = Component {
    name: "calls",
    migrations: &[Migration {
        version: 1,
        name: "the calls of every replica",
        sql: "
CREATE TABLE calls (
    seq        INT8 GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    replica    TEXT NOT NULL,
    id         INT8 NOT NULL,
    parent     INT8,
    at_ms      INT8 NOT NULL,
    tool       TEXT NOT NULL,
    caller     TEXT,
    via        TEXT NOT NULL,
    micros     INT8 NOT NULL,
    outcome    TEXT NOT NULL,
    message    TEXT,
    params     TEXT,
    result     TEXT,
    truncated  BOOL NOT NULL DEFAULT false
);
CREATE INDEX calls_at ON calls(at_ms, seq);
",
    }],
    tables: &["calls"],
};

/// What reading or writing the log failed on.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    File(#[from] rusqlite::Error),
    #[error(transparent)]
    Db(#[from] DbError),
}

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
    /// Entries before the one of this `seq` (the next page): in the file, lower seqs; in the
    /// shared database, older in time order (then lower seqs), so replicas' entries interleave.
    pub before: Option<i64>,
    /// Entries after this `seq`, in the order they were committed (following).
    pub after: Option<i64>,
    pub limit: usize,
}

/// One connection to the log file, or the shared database as one replica.
pub struct Store {
    backend: Backend,
}

enum Backend {
    File(Connection),
    Shared { pg: Pg, replica: Arc<str> },
}

impl Store {
    /// Opens (creating if needed) the log at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            let _ = std::fs::create_dir_all(parent);
        }
        let conn = Connection::open(path)?;
        Store::setup(conn)
    }

    /// Opens an existing log to read it: `None` when there is no file yet.
    pub fn open_existing(path: &Path) -> Result<Option<Store>, StoreError> {
        if !path.exists() {
            return Ok(None);
        }
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
        Store::setup(conn).map(Some)
    }

    /// The log in the shared database (migrated by `app::database`), written as `replica`.
    pub fn shared(pg: Pg, replica: Arc<str>) -> Store {
        Store { backend: Backend::Shared { pg, replica } }
    }

    /// The log of `settings`: the shared database when there is one, else its file.
    pub fn open_for(settings: &Settings, shared: Option<&crate::db::Shared>) -> Result<Store, StoreError> {
        match shared {
            Some(shared) => Ok(Store::shared(shared.pg.clone(), Arc::clone(&shared.replica))),
            None => Store::open(&settings.path),
        }
    }

    fn setup(mut conn: Connection) -> Result<Store, StoreError> {
        conn.busy_timeout(Duration::from_secs(10))?;
        // WAL, and no fsync: a committed batch survives the process being killed (the OS has
        // it), which is what the log promises; an OS crash may lose its last seconds. Syncing
        // cost the server more CPU than the inserts themselves.
        conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;")?;
        if let Err(newer) = crate::db::migrate::sqlite(&mut conn, &SQLITE)? {
            return Err(newer.into());
        }
        Ok(Store { backend: Backend::File(conn) })
    }

    /// Writes `entries` in one transaction: in the file [`ROWS_PER_INSERT`] to a statement
    /// (fewer statement steps; its effect on the writer's CPU was within the noise of the ops
    /// bench); in the shared database as one statement of arrays.
    pub fn insert(&mut self, entries: &[Box<Entry>], settings: &Settings) -> Result<(), StoreError> {
        let conn = match &mut self.backend {
            Backend::File(conn) => conn,
            Backend::Shared { pg, replica } => {
                let columns = pg::Columns::of(entries, settings);
                let replica = replica.to_string();
                return pg.run(move |client| pg::insert(client, replica, columns)).map_err(Into::into);
            }
        };
        let tx = conn.transaction()?;
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
        tx.commit()?;
        Ok(())
    }

    /// One small write (the header's user version, set to what it is; in the shared database
    /// an insert of no row, which a read-only server refuses too): whether the log takes writes
    /// again after a failed one.
    pub fn probe(&mut self) -> Result<(), StoreError> {
        let conn = match &self.backend {
            Backend::File(conn) => conn,
            Backend::Shared { pg, .. } => {
                return pg
                    .run(|client| async move {
                        client
                            .execute(
                                "INSERT INTO calls (replica, id, at_ms, tool, via, micros, outcome)
                                 SELECT '', 0, 0, '', '', 0, '' WHERE false",
                                &[],
                            )
                            .await
                    })
                    .map(drop)
                    .map_err(Into::into)
            }
        };
        let version: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
        conn.execute_batch(&format!("PRAGMA user_version = {version}"))?;
        Ok(())
    }

    /// Deletes entries older than `max_age`, then the oldest beyond `max_entries`.
    pub fn prune(&mut self, max_age: Duration, max_entries: u64) -> Result<usize, StoreError> {
        let cutoff = SystemTime::now()
            .checked_sub(max_age)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let conn = match &self.backend {
            Backend::File(conn) => conn,
            Backend::Shared { pg, .. } => {
                let keep = max_entries as i64;
                return pg.run(move |client| pg::prune(client, cutoff, keep)).map_err(Into::into);
            }
        };
        // Entries are written in about the order they start, so the oldest ones are the lowest
        // seqs: delete up to the newest entry that is too old.
        let last_old: Option<i64> =
            conn.query_row("SELECT MAX(seq) FROM calls WHERE at_ms < ?1", [cutoff], |r| r.get(0))?;
        let mut deleted = match last_old {
            Some(seq) => conn.execute("DELETE FROM calls WHERE seq <= ?1", [seq])?,
            None => 0,
        };
        let newest: Option<i64> = conn.query_row("SELECT MAX(seq) FROM calls", [], |r| r.get(0))?;
        if let Some(newest) = newest {
            let keep_from = newest - max_entries as i64;
            deleted += conn.execute("DELETE FROM calls WHERE seq <= ?1", [keep_from])?;
        }
        Ok(deleted)
    }

    /// The entries that match `filter`: newest first, or oldest first with `after`.
    pub fn query(&self, filter: &Filter) -> Result<Vec<CallRecord>, StoreError> {
        let since_ms = filter.since.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_millis() as i64);
        let conn = match &self.backend {
            Backend::File(conn) => conn,
            Backend::Shared { pg, .. } => {
                let filter = filter.clone();
                return pg.run(move |client| pg::query(client, filter, since_ms)).map_err(Into::into);
            }
        };
        let order = if filter.after.is_some() { "ASC" } else { "DESC" };
        let sql = format!(
            "SELECT seq, id, parent, at_ms, tool, caller, via, micros, outcome, message, params, result, truncated
             FROM calls
             WHERE (?1 IS NULL OR tool = ?1) AND (?2 IS NULL OR caller = ?2) AND (?3 IS NULL OR at_ms >= ?3)
               AND (?4 = 0 OR outcome != 'ok') AND (?5 IS NULL OR seq < ?5) AND (?6 IS NULL OR seq > ?6)
             ORDER BY seq {order} LIMIT ?7"
        );
        let mut statement = conn.prepare_cached(&sql)?;
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
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// How many entries the log holds.
    pub fn count(&self) -> Result<u64, StoreError> {
        let conn = match &self.backend {
            Backend::File(conn) => conn,
            Backend::Shared { pg, .. } => {
                return pg
                    .run(|client| async move { client.query_one("SELECT count(*) FROM calls", &[]).await })
                    .map(|row| row.get::<_, i64>(0) as u64)
                    .map_err(Into::into)
            }
        };
        Ok(conn.query_row("SELECT COUNT(*) FROM calls", [], |r| r.get::<_, i64>(0)).map(|n| n as u64)?)
    }

    /// The newest entry's `seq`, if any: in the shared database, the last committed (see
    /// `pg::insert`), so a follower that reads up to it misses nothing committed later.
    pub fn newest(&self) -> Result<Option<i64>, StoreError> {
        let conn = match &self.backend {
            Backend::File(conn) => conn,
            Backend::Shared { pg, .. } => {
                return pg
                    .run(|client| async move { client.query_one("SELECT max(seq) FROM calls", &[]).await })
                    .map(|row| row.get::<_, Option<i64>>(0))
                    .map_err(Into::into)
            }
        };
        Ok(conn.query_row("SELECT MAX(seq) FROM calls", [], |r| r.get(0)).optional().map(Option::flatten)?)
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
        replica: None,
    })
}

/// The same for PostgreSQL.
mod pg {
    use std::time::UNIX_EPOCH;

    use serde_json::Value as Json;

    use super::{cut, Entry, Filter, Settings};
    use crate::types::CallRecord;

    /// A batch as one array per column, owned (the writer gives its entries back to the pool
    /// while the statement runs on the database's runtime).
    pub(super) struct Columns {
        id: Vec<i64>,
        parent: Vec<Option<i64>>,
        at_ms: Vec<i64>,
        tool: Vec<String>,
        caller: Vec<Option<String>>,
        via: Vec<&'static str>,
        micros: Vec<i64>,
        outcome: Vec<&'static str>,
        message: Vec<Option<String>>,
        params: Vec<String>,
        result: Vec<Option<String>>,
        truncated: Vec<bool>,
    }

    /// Text as PostgreSQL takes it: it refuses NUL in text, and one such character (an error
    /// message a caller provoked) must not fail a batch, and with it the calls that wait for it.
    fn text(value: &str) -> String {
        if value.contains('\0') {
            value.replace('\0', "\u{fffd}")
        } else {
            value.to_string()
        }
    }

    impl Columns {
        /// `entries` as [`super::bind`] binds them: the tool name and the message cut, the
        /// message redacted.
        pub(super) fn of(entries: &[Box<Entry>], settings: &Settings) -> Columns {
            let n = entries.len();
            let mut c = Columns {
                id: Vec::with_capacity(n),
                parent: Vec::with_capacity(n),
                at_ms: Vec::with_capacity(n),
                tool: Vec::with_capacity(n),
                caller: Vec::with_capacity(n),
                via: Vec::with_capacity(n),
                micros: Vec::with_capacity(n),
                outcome: Vec::with_capacity(n),
                message: Vec::with_capacity(n),
                params: Vec::with_capacity(n),
                result: Vec::with_capacity(n),
                truncated: Vec::with_capacity(n),
            };
            for e in entries {
                c.id.push(e.id as i64);
                c.parent.push(e.parent.map(|p| p as i64));
                c.at_ms.push(e.at.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0));
                c.tool.push(text(&cut(&e.tool, crate::contract::MAX_NAME_BYTES)));
                c.caller.push((!e.caller.is_empty()).then(|| text(&e.caller)));
                c.via.push(e.via);
                c.micros.push(e.micros as i64);
                c.outcome.push(e.outcome);
                c.message.push(
                    e.message
                        .as_ref()
                        .map(|m| text(&cut(&crate::config::redact::string(m.clone()), settings.max_value_bytes))),
                );
                c.params.push(text(&e.params.text));
                c.result.push(e.has_result.then(|| text(&e.result.text)));
                c.truncated.push(e.params.cut || (e.has_result && e.result.cut));
            }
            c
        }
    }

    /// One batch in one transaction, under a lock that replicas' batches take in turn: seqs are
    /// then handed out in the order batches commit, so `seq > last` finds every entry committed
    /// after `last` (a follower misses none), at the cost of one replica's batch waiting for
    /// another's (a few milliseconds each).
    pub(super) async fn insert(
        mut client: deadpool_postgres::Object,
        replica: String,
        c: Columns,
    ) -> Result<(), tokio_postgres::Error> {
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || 'ctx calls'))", &[]).await?;
        tx.execute(
            "INSERT INTO calls (replica, id, parent, at_ms, tool, caller, via, micros, outcome, message, params, result, truncated)
             SELECT $1::text, * FROM UNNEST($2::int8[], $3::int8[], $4::int8[], $5::text[], $6::text[], $7::text[],
                                            $8::int8[], $9::text[], $10::text[], $11::text[], $12::text[], $13::bool[])",
            &[
                &replica,
                &c.id,
                &c.parent,
                &c.at_ms,
                &c.tool,
                &c.caller,
                &c.via,
                &c.micros,
                &c.outcome,
                &c.message,
                &c.params,
                &c.result,
                &c.truncated,
            ],
        )
        .await?;
        tx.commit().await
    }

    /// Deletes what started before `cutoff`, then all but the newest `keep` in time order.
    pub(super) async fn prune(
        client: deadpool_postgres::Object,
        cutoff: i64,
        keep: i64,
    ) -> Result<usize, tokio_postgres::Error> {
        let mut deleted = client.execute("DELETE FROM calls WHERE at_ms < $1::int8", &[&cutoff]).await?;
        deleted += client
            .execute(
                "DELETE FROM calls WHERE (at_ms, seq) <=
                   (SELECT at_ms, seq FROM calls ORDER BY at_ms DESC, seq DESC OFFSET $1::int8 LIMIT 1)",
                &[&keep],
            )
            .await?;
        Ok(deleted as usize)
    }

    /// Newest first in time order (then seq); with `after`, in the order entries were committed.
    pub(super) async fn query(
        client: deadpool_postgres::Object,
        filter: Filter,
        since_ms: Option<i64>,
    ) -> Result<Vec<CallRecord>, tokio_postgres::Error> {
        let (window, order) = match filter.after {
            // Following: everything committed after the last entry seen, up to `before`.
            Some(_) => ("seq > $6::int8 AND ($5::int8 IS NULL OR seq < $5::int8)", "seq ASC"),
            // Paging: older than the `before` entry in time order. A cursor entry that retention
            // deleted took every older one with it: the page is empty.
            None => (
                "$6::int8 IS NULL AND ($5::int8 IS NULL OR (at_ms, seq) < (SELECT at_ms, seq FROM calls WHERE seq = $5::int8))",
                "at_ms DESC, seq DESC",
            ),
        };
        let sql = format!(
            "SELECT seq, id, parent, at_ms, tool, caller, via, micros, outcome, message, params, result, truncated, replica
             FROM calls
             WHERE ($1::text IS NULL OR tool = $1::text) AND ($2::text IS NULL OR caller = $2::text)
               AND ($3::int8 IS NULL OR at_ms >= $3::int8) AND (NOT $4::bool OR outcome <> 'ok') AND {window}
             ORDER BY {order} LIMIT $7::int8"
        );
        let limit = filter.limit as i64;
        let rows = client
            .query(
                &sql,
                &[&filter.tool, &filter.caller, &since_ms, &filter.errors_only, &filter.before, &filter.after, &limit],
            )
            .await?;
        let json = |text: Option<String>| text.map(|t| serde_json::from_str(&t).unwrap_or(Json::String(t)));
        Ok(rows
            .iter()
            .map(|row| CallRecord {
                seq: row.get(0),
                id: row.get(1),
                parent: row.get(2),
                at: chrono::DateTime::from_timestamp_millis(row.get(3)).unwrap_or_default(),
                tool: row.get(4),
                caller: row.get(5),
                via: row.get(6),
                ms: row.get::<_, i64>(7) as f64 / 1000.0,
                outcome: row.get(8),
                message: row.get(9),
                params: json(row.get(10)),
                result: json(row.get(11)),
                truncated: row.get(12),
                replica: Some(row.get(13)),
            })
            .collect())
    }
}

/// Runs `test` on a log file, then on the log in a fresh PostgreSQL database (when the tests
/// have a server; see `db::testing`). The second argument names the backend, for messages.
#[cfg(test)]
pub(crate) fn each_backend(mut test: impl FnMut(Store, &str)) {
    let dir = tempfile::tempdir().unwrap();
    test(Store::open(&dir.path().join("calls.sqlite")).unwrap(), "sqlite");
    if let Some(db) = crate::db::testing::database() {
        test(Store::shared(migrated(&db), Arc::from("replica-a")), "postgres");
    }
}

#[cfg(test)]
fn migrated(db: &crate::db::testing::TestDb) -> Pg {
    let pg = db.pg();
    let migrating = pg.clone();
    crate::db::block(async move { crate::db::migrate::pg(&migrating, &[&PG]).await }).expect("migrations apply");
    pg
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

    fn settings(max_entries: u64, max_value_bytes: usize) -> Settings {
        Settings {
            path: "unused.sqlite".into(),
            max_age: Duration::from_secs(3600),
            max_entries,
            max_value_bytes,
            redact: Vec::new(),
        }
    }

    #[test]
    fn batches_of_many_statements_and_a_remainder_all_land_in_order() {
        each_backend(|mut store, backend| {
            let settings = settings(1000, 16);
            let now = SystemTime::now();
            let mut rows: Vec<Box<Entry>> =
                (1..=ROWS_PER_INSERT as u64 * 2 + 5).map(|id| entry(id, "echo", "ok", now)).collect();
            rows[70].message = Some("a message longer than sixteen bytes".into());
            rows[70].has_result = false;
            rows[70].caller.clear();
            store.insert(&rows, &settings).unwrap();
            let all = store.query(&Filter { after: Some(0), limit: 1000, ..Default::default() }).unwrap();
            assert_eq!(all.len(), rows.len(), "{backend}");
            assert!(all.iter().zip(1..).all(|(r, id)| r.id == id), "{backend}: ids out of order");
            let cut = &all[70];
            assert_eq!(cut.message.as_deref(), Some("a message longer… [cut: 35 bytes in all]"), "{backend}");
            assert_eq!((cut.result.clone(), cut.caller.clone()), (None, None), "{backend}");
            assert_eq!(all[71].caller.as_deref(), Some("ci"), "{backend}");
            assert_eq!(store.count().unwrap(), rows.len() as u64, "{backend}");
            assert_eq!(store.newest().unwrap(), Some(all.last().unwrap().seq), "{backend}");
        });
    }

    #[test]
    fn written_rows_read_back_newest_first_with_filters_and_retention() {
        each_backend(|mut store, backend| {
            let settings = settings(3, 4096);
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
            assert_eq!(all.iter().map(|r| r.id).collect::<Vec<_>>(), [5, 4, 3, 2, 1], "{backend}");
            assert_eq!(all[0].params, Some(json!({"q": 5})), "{backend}");
            assert_eq!(all[0].ms, 1.5, "{backend}");
            let errors = store.query(&Filter { errors_only: true, limit: 10, ..Default::default() }).unwrap();
            assert_eq!(errors.iter().map(|r| r.id).collect::<Vec<_>>(), [3], "{backend}");
            let echo = store.query(&Filter { tool: Some("echo".into()), limit: 10, ..Default::default() }).unwrap();
            assert_eq!(echo.len(), 2, "{backend}");
            let recent =
                store.query(&Filter { since: Some(now - Duration::from_secs(60)), limit: 10, ..Default::default() });
            assert_eq!(recent.unwrap().len(), 4, "{backend}");
            let after = Some(all[2].seq);
            let followed = store.query(&Filter { after, limit: 10, ..Default::default() }).unwrap();
            assert_eq!(followed.iter().map(|r| r.id).collect::<Vec<_>>(), [4, 5], "{backend}");
            let page = store.query(&Filter { before: Some(all[1].seq), limit: 2, ..Default::default() }).unwrap();
            assert_eq!(page.iter().map(|r| r.id).collect::<Vec<_>>(), [3, 2], "{backend}");
            // The one older than an hour goes by age, then the oldest beyond three by count.
            assert_eq!(store.prune(Duration::from_secs(3600), 3).unwrap(), 2, "{backend}");
            let left = store.query(&Filter { limit: 10, ..Default::default() }).unwrap();
            assert_eq!(left.iter().map(|r| r.id).collect::<Vec<_>>(), [5, 4, 3], "{backend}");
            store.probe().unwrap();
        });
    }

    #[test]
    fn replicas_on_one_database_log_into_one_table_read_in_time_order_each_naming_its_replica() {
        let Some(db) = crate::db::testing::database() else { return };
        let pg = migrated(&db);
        let mut a = Store::shared(pg, Arc::from("host-a:7391"));
        let mut b = Store::shared(db.pg(), Arc::from("host-b:7391"));
        let settings = settings(1000, 4096);
        let t0 = SystemTime::now() - Duration::from_secs(10);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // B's batch commits after A's but holds calls that started between A's: time order
        // interleaves them, commit order does not.
        a.insert(&[entry(1, "echo", "ok", at(0)), entry(2, "echo", "ok", at(20))], &settings).unwrap();
        b.insert(&[entry(1, "echo", "ok", at(10)), entry(2, "echo", "ok", at(30))], &settings).unwrap();
        let seen = |records: &[CallRecord]| -> Vec<(String, i64)> {
            records.iter().map(|r| (r.replica.clone().unwrap_or_default(), r.id)).collect()
        };
        let newest = b.query(&Filter { limit: 10, ..Default::default() }).unwrap();
        let interleaved = [("host-b:7391", 2), ("host-a:7391", 2), ("host-b:7391", 1), ("host-a:7391", 1)];
        let expected: Vec<(String, i64)> = interleaved.iter().map(|(r, id)| (r.to_string(), *id)).collect();
        assert_eq!(seen(&newest), expected, "one query, both replicas, newest first in time");
        // Pages follow the same order: the second starts where the first ended.
        let first = a.query(&Filter { limit: 3, ..Default::default() }).unwrap();
        let next = a.query(&Filter { before: Some(first[2].seq), limit: 3, ..Default::default() }).unwrap();
        assert_eq!(seen(&next), expected[3..].to_vec());
        // A follower sees every entry committed after the last it saw, whichever replica wrote it.
        let last = a.newest().unwrap().unwrap();
        a.insert(&[entry(3, "echo", "ok", at(5))], &settings).unwrap();
        b.insert(&[entry(3, "echo", "ok", at(40))], &settings).unwrap();
        let followed = a.query(&Filter { after: Some(last), limit: 10, ..Default::default() }).unwrap();
        assert_eq!(seen(&followed), [("host-a:7391".to_string(), 3), ("host-b:7391".to_string(), 3)]);
        assert_eq!(b.count().unwrap(), 6);
        // Retention by count keeps the newest in time, whichever replica wrote them.
        assert_eq!(a.prune(Duration::from_secs(3600), 2).unwrap(), 4);
        let left = b.query(&Filter { limit: 10, ..Default::default() }).unwrap();
        assert_eq!(seen(&left), [("host-b:7391".to_string(), 3), ("host-b:7391".to_string(), 2)]);
    }

    #[test]
    fn a_nul_in_a_message_does_not_fail_the_batch_on_postgresql() {
        let Some(db) = crate::db::testing::database() else { return };
        let mut store = Store::shared(migrated(&db), Arc::from("r"));
        let mut bad = entry(1, "echo", "tool_error", SystemTime::now());
        bad.message = Some("before\0after".into());
        bad.has_result = false;
        store.insert(&[bad, entry(2, "echo", "ok", SystemTime::now())], &settings(10, 4096)).unwrap();
        let all = store.query(&Filter { limit: 10, ..Default::default() }).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].message.as_deref(), Some("before\u{fffd}after"));
    }
}
