//! Approvals in SQLite (`approvals.sqlite` beside the knowledge base), so `ctx approvals` in
//! another process sees and decides what a server holds; or in the shared PostgreSQL database,
//! so an approval asked through one replica is decided through a second and runs through a third.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension};

use crate::db::migrate::{Component, Migration};
use crate::db::{Pg, Place};
use crate::types::{Approval, ApprovalState};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS approvals (
    id          TEXT PRIMARY KEY,
    token_hash  TEXT NOT NULL,
    tool        TEXT NOT NULL,
    params      TEXT NOT NULL,
    caller      TEXT NOT NULL,
    via         TEXT NOT NULL,
    state       TEXT NOT NULL,
    created_ms  INTEGER NOT NULL,
    expires_ms  INTEGER NOT NULL,
    decided_ms  INTEGER,
    decided_by  TEXT,
    reason      TEXT
);
CREATE INDEX IF NOT EXISTS approvals_token ON approvals(token_hash);
CREATE INDEX IF NOT EXISTS approvals_pending ON approvals(state, caller);
CREATE INDEX IF NOT EXISTS approvals_created ON approvals(created_ms);
-- Every token handed out for an approval: the same call asked again gets a token of its own,
-- and the earlier ones keep working (two identical calls waiting in scripts both hold one).
CREATE TABLE IF NOT EXISTS approval_tokens (
    token_hash  TEXT PRIMARY KEY,
    id          TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS approval_tokens_id ON approval_tokens(id);
";

/// The SQLite file's tables. Step 1 is what files made before versioned migrations hold, so
/// it applies to them as a no-op.
// Static: immutable, a store's migrations: SQL text compiled in, the same for every application.
static SQLITE: Component = Component {
    name: "approvals",
    migrations: &[Migration { version: 1, name: "approvals and their tokens", sql: SCHEMA }],
    tables: &["approvals", "approval_tokens"],
};

/// The tables in the shared database.
// Static: immutable, a store's migrations: SQL text compiled in, the same for every application.
pub static PG: Component = Component {
    name: "approvals",
    migrations: &[Migration {
        version: 1,
        name: "approvals, their tokens and the question key",
        sql: "
CREATE TABLE approvals (
    id          TEXT PRIMARY KEY,
    token_hash  TEXT NOT NULL,
    tool        TEXT NOT NULL,
    params      TEXT NOT NULL,
    caller      TEXT NOT NULL,
    via         TEXT NOT NULL,
    state       TEXT NOT NULL,
    created_ms  INT8 NOT NULL,
    expires_ms  INT8 NOT NULL,
    decided_ms  INT8,
    decided_by  TEXT,
    reason      TEXT
);
CREATE INDEX approvals_token ON approvals(token_hash);
CREATE INDEX approvals_pending ON approvals(state, caller);
CREATE INDEX approvals_created ON approvals(created_ms);
CREATE TABLE approval_tokens (
    token_hash  TEXT PRIMARY KEY,
    id          TEXT NOT NULL,
    added       BIGSERIAL NOT NULL
);
CREATE INDEX approval_tokens_id ON approval_tokens(id, added);
-- The key of approval questions' MACs, one for every replica: a question asked through one
-- is answered through another.
CREATE TABLE approval_keys (
    name   TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);
",
    }],
    tables: &["approvals", "approval_tokens", "approval_keys"],
};

/// Tokens kept per approval: a caller asking again and again cannot grow the file; the oldest
/// stop working first.
pub(super) const TOKENS_PER_APPROVAL: i64 = 16;

/// Approvals kept at most; the oldest decided ones go first.
const KEEP: i64 = 10_000;

/// Where approvals are kept: one file, opened on first use (a config without approvals never
/// creates it), or the shared database.
pub struct Store {
    place: Place,
}

/// A row as stored.
#[derive(Clone, Debug)]
pub struct Row {
    pub id: String,
    pub token_hash: String,
    pub tool: String,
    pub params: String,
    pub caller: String,
    pub via: String,
    pub state: String,
    pub created_ms: i64,
    pub expires_ms: i64,
    pub decided_ms: Option<i64>,
    pub decided_by: Option<String>,
    pub reason: Option<String>,
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl Store {
    pub fn new(path: PathBuf) -> Store {
        Store { place: Place::file(path, open) }
    }

    /// The approvals of the shared database (migrated by `app::database`).
    pub fn shared(pg: Pg) -> Store {
        Store { place: Place::Shared(pg) }
    }

    /// The SQLite file, when approvals are kept in one.
    pub fn path(&self) -> Option<&Path> {
        self.place.path()
    }

    /// Whether any approval was ever kept (a file not yet made holds none).
    pub fn exists(&self) -> bool {
        self.path().is_none_or(Path::exists)
    }

    /// Runs `f` on the file's connection, or `g` on the shared database.
    fn either<T: Send + 'static, Fut>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
        g: impl FnOnce(deadpool_postgres::Object) -> Fut + Send + 'static,
    ) -> Result<T, String>
    where
        Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>> + Send,
    {
        self.place.either("approvals", f, g)
    }

    /// Records a pending approval, or gives the pending one of the same tool, parameters and
    /// caller another token and a new expiry (earlier tokens keep working, the last
    /// [`TOKENS_PER_APPROVAL`] of them). Returns its id. Refuses past `max_pending` pending
    /// approvals of one caller.
    pub fn ask(&self, row: &Row, max_pending: i64) -> Result<Result<String, i64>, String> {
        let owned = row.clone();
        self.either(
            |conn| {
                // One write transaction: a person's decision cannot land between the look-up of
                // the pending approval and its new token.
                let tx = rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)?;
                let asked = ask_in(&tx, row, max_pending)?;
                tx.commit()?;
                Ok(asked)
            },
            move |mut client| async move {
                let tx = client.transaction().await?;
                // Asks are serialized across replicas: two asking the same call at once share
                // one approval, as in one process.
                tx.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || 'ctx approvals'))", &[]).await?;
                let asked = pg::ask_in(&*tx, &owned, max_pending).await?;
                tx.commit().await?;
                Ok(asked)
            },
        )
    }

    /// The approval a token was given for.
    pub fn by_token(&self, token_hash: &str) -> Result<Option<Row>, String> {
        let owned = token_hash.to_string();
        self.either(
            |conn| {
                let sql = format!("{SELECT} WHERE id = (SELECT id FROM approval_tokens WHERE token_hash = ?1)");
                conn.query_row(&sql, [token_hash], row).optional()
            },
            move |client| async move {
                let sql = format!("{SELECT} WHERE id = (SELECT id FROM approval_tokens WHERE token_hash = $1::text)");
                Ok(client.query_opt(&sql, &[&owned]).await?.as_ref().map(pg::row))
            },
        )
    }

    pub fn by_id(&self, id: &str) -> Result<Option<Row>, String> {
        let owned = id.to_string();
        self.either(
            |conn| conn.query_row(&format!("{SELECT} WHERE id = ?1"), [id], row).optional(),
            move |client| async move {
                Ok(client.query_opt(&format!("{SELECT} WHERE id = $1::text"), &[&owned]).await?.as_ref().map(pg::row))
            },
        )
    }

    /// Marks an approved call used, once: `false` when it was not (still) approved and fresh.
    /// One statement on either backend, so two replicas running the same approved call at once
    /// cannot both use it.
    pub fn consume(&self, id: &str) -> Result<bool, String> {
        let owned = id.to_string();
        let now = now_ms();
        self.either(
            |conn| {
                let changed = conn.execute(
                    "UPDATE approvals SET state = 'used' WHERE id = ?1 AND state = 'approved' AND expires_ms > ?2",
                    params![id, now],
                )?;
                Ok(changed == 1)
            },
            move |client| async move {
                let changed = client
                    .execute(
                        "UPDATE approvals SET state = 'used' WHERE id = $1::text AND state = 'approved' AND expires_ms > $2::int8",
                        &[&owned, &now],
                    )
                    .await?;
                Ok(changed == 1)
            },
        )
    }

    /// Approves or denies a pending call. `Err` with the state it is in when it is not pending.
    pub fn decide(
        &self,
        id: &str,
        approve: bool,
        by: &str,
        reason: Option<&str>,
    ) -> Result<Result<Row, Option<String>>, String> {
        let now = now_ms();
        let state = if approve { "approved" } else { "denied" };
        let (owned_id, owned_by, owned_reason) = (id.to_string(), by.to_string(), reason.map(str::to_string));
        self.either(
            |conn| {
                expire(conn, now)?;
                let changed = conn.execute(
                    "UPDATE approvals SET state = ?1, decided_ms = ?2, decided_by = ?3, reason = ?4
                     WHERE id = ?5 AND state = 'pending'",
                    params![state, now, by, reason, id],
                )?;
                let current = conn.query_row(&format!("{SELECT} WHERE id = ?1"), [id], row).optional()?;
                Ok(match (changed, current) {
                    (1, Some(current)) => Ok(current),
                    (_, current) => Err(current.map(|c| c.state)),
                })
            },
            move |client| async move {
                pg::expire(&**client, now).await?;
                let changed = client
                    .execute(
                        "UPDATE approvals SET state = $1::text, decided_ms = $2::int8, decided_by = $3::text, reason = $4::text
                         WHERE id = $5::text AND state = 'pending'",
                        &[&state, &now, &owned_by, &owned_reason, &owned_id],
                    )
                    .await?;
                let current =
                    client.query_opt(&format!("{SELECT} WHERE id = $1::text"), &[&owned_id]).await?.as_ref().map(pg::row);
                Ok(match (changed, current) {
                    (1, Some(current)) => Ok(current),
                    (_, current) => Err(current.map(|c| c.state)),
                })
            },
        )
    }

    /// Approvals newest first: pending (and approved, not yet used) ones only unless `all`.
    pub fn list(&self, all: bool, limit: usize) -> Result<Vec<Row>, String> {
        let filter = if all { "" } else { " WHERE state IN ('pending', 'approved')" };
        let limit = limit as i64;
        self.either(
            |conn| {
                expire(conn, now_ms())?;
                let mut statement = conn.prepare(&format!("{SELECT}{filter} ORDER BY created_ms DESC LIMIT ?1"))?;
                let rows = statement.query_map([limit], row)?;
                rows.collect()
            },
            move |client| async move {
                pg::expire(&**client, now_ms()).await?;
                let sql = format!("{SELECT}{filter} ORDER BY created_ms DESC LIMIT $1::int8");
                Ok(client.query(&sql, &[&limit]).await?.iter().map(pg::row).collect())
            },
        )
    }

    /// How many calls wait for a decision now.
    pub fn pending(&self) -> Result<u64, String> {
        if !self.exists() {
            return Ok(0);
        }
        let now = now_ms();
        self.either(
            |conn| {
                conn.query_row(
                    "SELECT COUNT(*) FROM approvals WHERE state = 'pending' AND expires_ms > ?1",
                    [now],
                    |r| r.get::<_, i64>(0),
                )
                .map(|n| n as u64)
            },
            move |client| async move {
                let row = client
                    .query_one(
                        "SELECT COUNT(*) FROM approvals WHERE state = 'pending' AND expires_ms > $1::int8",
                        &[&now],
                    )
                    .await?;
                Ok(row.get::<_, i64>(0) as u64)
            },
        )
    }

    /// The key of approval questions' MACs in the shared database, made by the first replica
    /// that asks; `None` for a file (each process keeps its own, as before).
    pub fn shared_question_key(&self, fresh: &str) -> Result<Option<String>, String> {
        let Some(pg) = self.place.pg() else { return Ok(None) };
        let fresh = fresh.to_string();
        pg.run(move |client| async move {
            client
                .execute(
                    "INSERT INTO approval_keys (name, value) VALUES ('question', $1::text) ON CONFLICT (name) DO NOTHING",
                    &[&fresh],
                )
                .await?;
            let row = client.query_one("SELECT value FROM approval_keys WHERE name = 'question'", &[]).await?;
            Ok(Some(row.get(0)))
        })
        .map_err(|e| format!("approvals: {e}"))
    }
}

/// Marks what passed its time undecided or unused as expired.
fn expire(conn: &Connection, now: i64) -> rusqlite::Result<usize> {
    conn.execute(
        "UPDATE approvals SET state = 'expired' WHERE state IN ('pending', 'approved') AND expires_ms <= ?1",
        [now],
    )
}

const SELECT: &str = "SELECT id, token_hash, tool, params, caller, via, state, created_ms, expires_ms, decided_ms, decided_by, reason FROM approvals";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        id: r.get(0)?,
        token_hash: r.get(1)?,
        tool: r.get(2)?,
        params: r.get(3)?,
        caller: r.get(4)?,
        via: r.get(5)?,
        state: r.get(6)?,
        created_ms: r.get(7)?,
        expires_ms: r.get(8)?,
        decided_ms: r.get(9)?,
        decided_by: r.get(10)?,
        reason: r.get(11)?,
    })
}

/// [`Store::ask`] inside its transaction.
fn ask_in(conn: &Connection, row: &Row, max_pending: i64) -> rusqlite::Result<Result<String, i64>> {
    expire(conn, now_ms())?;
    let same: Option<String> = conn
        .query_row(
            "SELECT id FROM approvals WHERE state = 'pending' AND tool = ?1 AND params = ?2 AND caller = ?3",
            params![row.tool, row.params, row.caller],
            |r| r.get(0),
        )
        .optional()?;
    if let Some(id) = same {
        conn.execute(
            "UPDATE approvals SET token_hash = ?1, expires_ms = ?2 WHERE id = ?3 AND state = 'pending'",
            params![row.token_hash, row.expires_ms, id],
        )?;
        add_token(conn, &row.token_hash, &id)?;
        return Ok(Ok(id));
    }
    let pending: i64 =
        conn.query_row("SELECT COUNT(*) FROM approvals WHERE state = 'pending' AND caller = ?1", [&row.caller], |r| {
            r.get(0)
        })?;
    if pending >= max_pending {
        return Ok(Err(pending));
    }
    conn.execute(
        "INSERT INTO approvals (id, token_hash, tool, params, caller, via, state, created_ms, expires_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', ?7, ?8)",
        params![row.id, row.token_hash, row.tool, row.params, row.caller, row.via, row.created_ms, row.expires_ms],
    )?;
    add_token(conn, &row.token_hash, &row.id)?;
    // The oldest decided approvals beyond KEEP go, their tokens first.
    let trim = "(SELECT id FROM approvals WHERE state NOT IN ('pending', 'approved')
                 AND id IN (SELECT id FROM approvals ORDER BY created_ms DESC LIMIT -1 OFFSET ?1))";
    conn.execute(&format!("DELETE FROM approval_tokens WHERE id IN {trim}"), [KEEP])?;
    conn.execute(&format!("DELETE FROM approvals WHERE id IN {trim}"), [KEEP])?;
    Ok(Ok(row.id.clone()))
}

/// Records `token_hash` as a token of approval `id`, keeping its newest [`TOKENS_PER_APPROVAL`].
fn add_token(conn: &Connection, token_hash: &str, id: &str) -> rusqlite::Result<()> {
    conn.execute("INSERT OR REPLACE INTO approval_tokens (token_hash, id) VALUES (?1, ?2)", params![token_hash, id])?;
    conn.execute(
        "DELETE FROM approval_tokens WHERE id = ?1
           AND rowid NOT IN (SELECT rowid FROM approval_tokens WHERE id = ?1 ORDER BY rowid DESC LIMIT ?2)",
        params![id, TOKENS_PER_APPROVAL],
    )?;
    Ok(())
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(parent);
    }
    let mut conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")?;
    if let Err(newer) = crate::db::migrate::sqlite(&mut conn, &SQLITE)? {
        return Err(rusqlite::Error::ToSqlConversionFailure(Box::new(newer)));
    }
    // A file from before approval_tokens: its approvals' tokens are listed there too.
    conn.execute("INSERT OR IGNORE INTO approval_tokens (token_hash, id) SELECT token_hash, id FROM approvals", [])?;
    Ok(conn)
}

/// The same statements for PostgreSQL.
mod pg {
    use tokio_postgres::GenericClient;

    use super::{now_ms, Row, KEEP, TOKENS_PER_APPROVAL};

    pub(super) fn row(r: &tokio_postgres::Row) -> Row {
        Row {
            id: r.get(0),
            token_hash: r.get(1),
            tool: r.get(2),
            params: r.get(3),
            caller: r.get(4),
            via: r.get(5),
            state: r.get(6),
            created_ms: r.get(7),
            expires_ms: r.get(8),
            decided_ms: r.get(9),
            decided_by: r.get(10),
            reason: r.get(11),
        }
    }

    pub(super) async fn expire(client: &impl GenericClient, now: i64) -> Result<u64, tokio_postgres::Error> {
        client
            .execute(
                "UPDATE approvals SET state = 'expired' WHERE state IN ('pending', 'approved') AND expires_ms <= $1::int8",
                &[&now],
            )
            .await
    }

    pub(super) async fn ask_in(
        tx: &impl GenericClient,
        row: &Row,
        max_pending: i64,
    ) -> Result<Result<String, i64>, tokio_postgres::Error> {
        expire(tx, now_ms()).await?;
        let same = tx
            .query_opt(
                // Locked: a decision through another replica waits until the new token is in.
                "SELECT id FROM approvals WHERE state = 'pending' AND tool = $1::text AND params = $2::text AND caller = $3::text
                 FOR UPDATE",
                &[&row.tool, &row.params, &row.caller],
            )
            .await?;
        if let Some(same) = same {
            let id: String = same.get(0);
            tx.execute(
                "UPDATE approvals SET token_hash = $1::text, expires_ms = $2::int8 WHERE id = $3::text AND state = 'pending'",
                &[&row.token_hash, &row.expires_ms, &id],
            )
            .await?;
            add_token(tx, &row.token_hash, &id).await?;
            return Ok(Ok(id));
        }
        let pending: i64 = tx
            .query_one("SELECT COUNT(*) FROM approvals WHERE state = 'pending' AND caller = $1::text", &[&row.caller])
            .await?
            .get(0);
        if pending >= max_pending {
            return Ok(Err(pending));
        }
        tx.execute(
            "INSERT INTO approvals (id, token_hash, tool, params, caller, via, state, created_ms, expires_ms)
             VALUES ($1::text, $2::text, $3::text, $4::text, $5::text, $6::text, 'pending', $7::int8, $8::int8)",
            &[
                &row.id,
                &row.token_hash,
                &row.tool,
                &row.params,
                &row.caller,
                &row.via,
                &row.created_ms,
                &row.expires_ms,
            ],
        )
        .await?;
        add_token(tx, &row.token_hash, &row.id).await?;
        let trim = "(SELECT id FROM approvals WHERE state NOT IN ('pending', 'approved')
                     AND id IN (SELECT id FROM approvals ORDER BY created_ms DESC OFFSET $1::int8))";
        tx.execute(&format!("DELETE FROM approval_tokens WHERE id IN {trim}"), &[&KEEP]).await?;
        tx.execute(&format!("DELETE FROM approvals WHERE id IN {trim}"), &[&KEEP]).await?;
        Ok(Ok(row.id.clone()))
    }

    async fn add_token(tx: &impl GenericClient, token_hash: &str, id: &str) -> Result<(), tokio_postgres::Error> {
        tx.execute(
            "INSERT INTO approval_tokens (token_hash, id) VALUES ($1::text, $2::text)
             ON CONFLICT (token_hash) DO UPDATE SET id = excluded.id, added = nextval(pg_get_serial_sequence('approval_tokens', 'added'))",
            &[&token_hash, &id],
        )
        .await?;
        tx.execute(
            "DELETE FROM approval_tokens WHERE id = $1::text
               AND added NOT IN (SELECT added FROM approval_tokens WHERE id = $1::text ORDER BY added DESC LIMIT $2::int8)",
            &[&id, &TOKENS_PER_APPROVAL],
        )
        .await?;
        Ok(())
    }
}

impl Row {
    /// The wire form (no token: it was handed out once, to the caller).
    pub fn approval(&self) -> Approval {
        let at = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default();
        Approval {
            id: self.id.clone(),
            tool: self.tool.clone(),
            params: serde_json::from_str(&self.params).unwrap_or(serde_json::Value::Null),
            caller: (!self.caller.is_empty()).then(|| self.caller.clone()),
            via: self.via.clone(),
            state: match self.state.as_str() {
                "pending" => ApprovalState::Pending,
                "approved" => ApprovalState::Approved,
                "denied" => ApprovalState::Denied,
                "used" => ApprovalState::Used,
                _ => ApprovalState::Expired,
            },
            created_at: at(self.created_ms),
            expires_at: at(self.expires_ms),
            decided_at: self.decided_ms.map(at),
            decided_by: self.decided_by.clone(),
            reason: self.reason.clone(),
            token: None,
            message: None,
        }
    }
}

/// Runs `test` on a file store, then on a store in a fresh PostgreSQL database (when the tests
/// have a server; see `db::testing`). The second argument names the backend, for messages.
#[cfg(test)]
pub(crate) fn each_backend(mut test: impl FnMut(Store, &str)) {
    let dir = tempfile::tempdir().unwrap();
    test(Store::new(dir.path().join("approvals.sqlite")), "sqlite");
    if let Some(db) = crate::db::testing::database() {
        test(Store::shared(migrated(&db)), "postgres");
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

    fn asked(id: &str, token: &str) -> Row {
        Row {
            id: id.into(),
            token_hash: token.into(),
            tool: "deploy".into(),
            params: "{}".into(),
            caller: "ci".into(),
            via: "rest".into(),
            state: "pending".into(),
            created_ms: now_ms(),
            expires_ms: now_ms() + 600_000,
            decided_ms: None,
            decided_by: None,
            reason: None,
        }
    }

    #[test]
    fn an_approval_is_decided_once_and_used_once_on_either_backend() {
        each_backend(|store, backend| {
            assert_eq!(store.ask(&asked("ap-1", "h-1"), 100).unwrap(), Ok("ap-1".to_string()), "{backend}");
            assert_eq!(store.pending().unwrap(), 1, "{backend}");
            assert!(!store.consume("ap-1").unwrap(), "{backend}: pending is not approved");
            let decided = store.decide("ap-1", true, "a person", Some("ok")).unwrap().unwrap();
            assert_eq!((decided.state.as_str(), decided.decided_by.as_deref()), ("approved", Some("a person")));
            assert_eq!(store.decide("ap-1", false, "b", None).unwrap().unwrap_err().as_deref(), Some("approved"));
            assert!(store.consume("ap-1").unwrap(), "{backend}");
            assert!(!store.consume("ap-1").unwrap(), "{backend}: used once");
            assert_eq!(store.list(true, 10).unwrap()[0].state, "used", "{backend}");
            assert!(store.list(false, 10).unwrap().is_empty(), "{backend}");
            // The per-caller cap counts pending approvals only.
            store.ask(&Row { params: "{\"a\":1}".into(), ..asked("ap-2", "h-2") }, 1).unwrap().unwrap();
            assert_eq!(store.ask(&Row { params: "{\"a\":2}".into(), ..asked("ap-3", "h-3") }, 1).unwrap(), Err(1));
        });
    }

    #[test]
    fn replicas_on_one_database_share_approvals_and_the_question_key() {
        let Some(db) = crate::db::testing::database() else { return };
        let pg = migrated(&db);
        let (a, b, c) = (Store::shared(pg.clone()), Store::shared(db.pg()), Store::shared(db.pg()));
        // Asked through one, decided through a second, used through a third, once.
        a.ask(&asked("ap-x", "h-x"), 100).unwrap().unwrap();
        assert_eq!(b.by_token("h-x").unwrap().map(|r| r.id).as_deref(), Some("ap-x"));
        b.decide("ap-x", true, "a person", None).unwrap().unwrap();
        let used: Vec<bool> = std::thread::scope(|s| {
            let racers: Vec<_> = [&a, &b, &c].map(|store| s.spawn(move || store.consume("ap-x").unwrap())).into();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        assert_eq!(used.iter().filter(|u| **u).count(), 1, "{used:?}");
        // The first replica's key is every replica's.
        let first = a.shared_question_key("key-of-a").unwrap();
        assert_eq!(first.as_deref(), Some("key-of-a"));
        assert_eq!(c.shared_question_key("key-of-c").unwrap(), first);
    }

    #[test]
    fn a_file_from_before_approval_tokens_keeps_its_tokens_working() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("approvals.sqlite");
        {
            // The schema as it was: tokens only in approvals.token_hash.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE approvals (id TEXT PRIMARY KEY, token_hash TEXT NOT NULL, tool TEXT NOT NULL,
                   params TEXT NOT NULL, caller TEXT NOT NULL, via TEXT NOT NULL, state TEXT NOT NULL,
                   created_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL, decided_ms INTEGER,
                   decided_by TEXT, reason TEXT);",
            )
            .unwrap();
            let soon = now_ms() + 600_000;
            conn.execute(
                "INSERT INTO approvals VALUES ('ap-old', 'hash-old', 'deploy', '{}', 'ci', 'rest', 'pending', 1, ?1, NULL, NULL, NULL)",
                [soon],
            )
            .unwrap();
        }
        let store = Store::new(path);
        let row = store.by_token("hash-old").unwrap().expect("the old token still resolves");
        assert_eq!((row.id.as_str(), row.state.as_str()), ("ap-old", "pending"));
        // Asked again, the old approval gets a second token and the first keeps working.
        let again = Row { id: "ap-new".into(), token_hash: "hash-new".into(), ..row.clone() };
        assert_eq!(store.ask(&again, 100).unwrap(), Ok("ap-old".to_string()));
        assert_eq!(store.by_token("hash-old").unwrap().map(|r| r.id), Some("ap-old".to_string()));
        assert_eq!(store.by_token("hash-new").unwrap().map(|r| r.id), Some("ap-old".to_string()));
        assert!(store.by_token("hash-unknown").unwrap().is_none());
    }
}
