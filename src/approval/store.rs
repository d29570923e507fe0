//! Approvals in SQLite (`approvals.sqlite` beside the knowledge base), so `ctx approvals` in
//! another process sees and decides what a server holds.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension};

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

/// Tokens kept per approval: a caller asking again and again cannot grow the file; the oldest
/// stop working first.
pub(super) const TOKENS_PER_APPROVAL: i64 = 16;

/// Approvals kept at most; the oldest decided ones go first.
const KEEP: i64 = 10_000;

/// One approvals file, opened on first use (a config without approvals never creates it).
pub struct Store {
    path: PathBuf,
    conn: Mutex<Option<Connection>>,
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
        Store { path, conn: Mutex::new(None) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the connection, opening the file first if needed.
    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, String> {
        let mut slot = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(open(&self.path).map_err(|e| format!("{}: {e}", self.path.display()))?);
        }
        let conn = slot.as_ref().expect("opened above");
        f(conn).map_err(|e| format!("{}: {e}", self.path.display()))
    }

    /// Records a pending approval, or gives the pending one of the same tool, parameters and
    /// caller another token and a new expiry (earlier tokens keep working, the last
    /// [`TOKENS_PER_APPROVAL`] of them). Returns its id. Refuses past `max_pending` pending
    /// approvals of one caller.
    pub fn ask(&self, row: &Row, max_pending: i64) -> Result<Result<String, i64>, String> {
        self.with(|conn| {
            // One write transaction: a person's decision cannot land between the look-up of
            // the pending approval and its new token.
            let tx = rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)?;
            let asked = ask_in(&tx, row, max_pending)?;
            tx.commit()?;
            Ok(asked)
        })
    }

    /// The approval a token was given for.
    pub fn by_token(&self, token_hash: &str) -> Result<Option<Row>, String> {
        self.with(|conn| {
            let sql = format!("{SELECT} WHERE id = (SELECT id FROM approval_tokens WHERE token_hash = ?1)");
            conn.query_row(&sql, [token_hash], row).optional()
        })
    }

    pub fn by_id(&self, id: &str) -> Result<Option<Row>, String> {
        self.with(|conn| conn.query_row(&format!("{SELECT} WHERE id = ?1"), [id], row).optional())
    }

    /// Marks an approved call used, once: `false` when it was not (still) approved and fresh.
    pub fn consume(&self, id: &str) -> Result<bool, String> {
        self.with(|conn| {
            let changed = conn.execute(
                "UPDATE approvals SET state = 'used' WHERE id = ?1 AND state = 'approved' AND expires_ms > ?2",
                params![id, now_ms()],
            )?;
            Ok(changed == 1)
        })
    }

    /// Approves or denies a pending call. `Err` with the state it is in when it is not pending.
    pub fn decide(
        &self,
        id: &str,
        approve: bool,
        by: &str,
        reason: Option<&str>,
    ) -> Result<Result<Row, Option<String>>, String> {
        self.with(|conn| {
            let now = now_ms();
            expire(conn, now)?;
            let state = if approve { "approved" } else { "denied" };
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
        })
    }

    /// Approvals newest first: pending (and approved, not yet used) ones only unless `all`.
    pub fn list(&self, all: bool, limit: usize) -> Result<Vec<Row>, String> {
        self.with(|conn| {
            expire(conn, now_ms())?;
            let filter = if all { "" } else { " WHERE state IN ('pending', 'approved')" };
            let mut statement = conn.prepare(&format!("{SELECT}{filter} ORDER BY created_ms DESC LIMIT ?1"))?;
            let rows = statement.query_map([limit as i64], row)?;
            rows.collect()
        })
    }

    /// How many calls wait for a decision now.
    pub fn pending(&self) -> Result<u64, String> {
        if !self.path.exists() {
            return Ok(0);
        }
        self.with(|conn| {
            conn.query_row(
                "SELECT COUNT(*) FROM approvals WHERE state = 'pending' AND expires_ms > ?1",
                [now_ms()],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
        })
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
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")?;
    conn.execute_batch(SCHEMA)?;
    // A file from before approval_tokens: its approvals' tokens are listed there too.
    conn.execute("INSERT OR IGNORE INTO approval_tokens (token_hash, id) SELECT token_hash, id FROM approvals", [])?;
    Ok(conn)
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

#[cfg(test)]
mod tests {
    use super::*;

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
