//! Tasks in SQLite (`tasks.sqlite` beside the knowledge base): a task's status and its
//! outcome outlive the process that ran it, for `[tasks] ttl_secs`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tasks (
    id          TEXT PRIMARY KEY,
    owner       TEXT NOT NULL,
    tool        TEXT NOT NULL,
    via         TEXT NOT NULL,
    status      TEXT NOT NULL,
    message     TEXT,
    progress    TEXT,
    approval    TEXT,
    outcome     TEXT,
    mcp_status  TEXT,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    expires_ms  INTEGER NOT NULL,
    run         TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_owner ON tasks(owner, created_ms);
CREATE INDEX IF NOT EXISTS tasks_expires ON tasks(expires_ms);
CREATE INDEX IF NOT EXISTS tasks_open ON tasks(status, run);
";

/// One tasks file, opened on first use.
pub struct Store {
    path: PathBuf,
    conn: Mutex<Option<Connection>>,
}

/// A task as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub id: String,
    /// The caller that started it: a scoped token's name, or empty for unscoped callers.
    pub owner: String,
    pub tool: String,
    pub via: String,
    pub status: String,
    pub message: Option<String>,
    /// The latest progress report, as JSON.
    pub progress: Option<String>,
    pub approval: Option<String>,
    /// The outcome, as JSON (see `super::Outcome`), once the task ended.
    pub outcome: Option<String>,
    /// The status as MCP reads it, once the task ended (see `super::Seen::mcp_status`).
    pub mcp_status: Option<String>,
    pub created_ms: i64,
    pub updated_ms: i64,
    pub expires_ms: i64,
    /// The process run that runs it: a task of another run that never ended was lost.
    pub run: String,
}

const SELECT: &str = "SELECT id, owner, tool, via, status, message, progress, approval, outcome, mcp_status, created_ms, updated_ms, expires_ms, run FROM tasks";
/// The same columns without the outcome (up to `[tasks] max_result_bytes` each): what a list reads.
const SELECT_BRIEF: &str = "SELECT id, owner, tool, via, status, message, progress, approval, NULL, mcp_status, created_ms, updated_ms, expires_ms, run FROM tasks";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        id: r.get(0)?,
        owner: r.get(1)?,
        tool: r.get(2)?,
        via: r.get(3)?,
        status: r.get(4)?,
        message: r.get(5)?,
        progress: r.get(6)?,
        approval: r.get(7)?,
        outcome: r.get(8)?,
        mcp_status: r.get(9)?,
        created_ms: r.get(10)?,
        updated_ms: r.get(11)?,
        expires_ms: r.get(12)?,
        run: r.get(13)?,
    })
}

impl Store {
    pub fn new(path: PathBuf) -> Store {
        Store { path, conn: Mutex::new(None) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, String> {
        let mut slot = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(open(&self.path).map_err(|e| format!("{}: {e}", self.path.display()))?);
        }
        let conn = slot.as_ref().expect("opened above");
        f(conn).map_err(|e| {
            // A broken connection is opened again on the next use.
            let message = format!("{}: {e}", self.path.display());
            *slot = None;
            message
        })
    }

    pub fn insert(&self, task: &Row) -> Result<(), String> {
        self.with(|conn| {
            conn.execute(
                "INSERT INTO tasks (id, owner, tool, via, status, message, progress, approval, outcome, created_ms, updated_ms, expires_ms, run)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                params![
                    task.id,
                    task.owner,
                    task.tool,
                    task.via,
                    task.status,
                    task.message,
                    task.progress,
                    task.approval,
                    task.outcome,
                    task.created_ms,
                    task.updated_ms,
                    task.expires_ms,
                    task.run
                ],
            )?;
            Ok(())
        })
    }

    /// Writes a task's status, message, progress, approval and outcome.
    pub fn update(&self, task: &Row) -> Result<(), String> {
        self.with(|conn| {
            conn.execute(
                "UPDATE tasks SET status = ?2, message = ?3, progress = ?4, approval = ?5, outcome = ?6, mcp_status = ?7, updated_ms = ?8, expires_ms = ?9 WHERE id = ?1",
                params![
                    task.id,
                    task.status,
                    task.message,
                    task.progress,
                    task.approval,
                    task.outcome,
                    task.mcp_status,
                    task.updated_ms,
                    task.expires_ms
                ],
            )?;
            Ok(())
        })
    }

    /// The task `id`, unless it expired.
    pub fn get(&self, id: &str, now_ms: i64) -> Result<Option<Row>, String> {
        self.with(|conn| {
            conn.query_row(&format!("{SELECT} WHERE id = ?1 AND expires_ms > ?2"), params![id, now_ms], row).optional()
        })
    }

    /// `owner`'s tasks that have not expired, newest first.
    pub fn list(&self, owner: &str, now_ms: i64, limit: usize) -> Result<Vec<Row>, String> {
        self.with(|conn| {
            let sql =
                format!("{SELECT_BRIEF} WHERE owner = ?1 AND expires_ms > ?2 ORDER BY created_ms DESC, id LIMIT ?3");
            let mut statement = conn.prepare(&sql)?;
            let rows = statement.query_map(params![owner, now_ms, limit as i64], row)?;
            rows.collect()
        })
    }

    /// Marks every task that another run left working or waiting as failed, with `why`: its run
    /// is gone, and nothing will end it. Returns how many.
    pub fn fail_lost(&self, this_run: &str, why: &str, now_ms: i64) -> Result<usize, String> {
        self.with(|conn| {
            conn.execute(
                "UPDATE tasks SET status = 'failed', message = ?2, updated_ms = ?3
                 WHERE status IN ('working', 'input_required') AND run != ?1",
                params![this_run, why, now_ms],
            )
        })
    }

    /// Drops the ended tasks past their expiry (a task still running keeps its row: its end
    /// is written there).
    pub fn purge(&self, now_ms: i64) -> Result<usize, String> {
        self.with(|conn| {
            conn.execute(
                "DELETE FROM tasks WHERE expires_ms <= ?1 AND status IN ('completed', 'failed', 'cancelled')",
                [now_ms],
            )
        })
    }

    /// Keeps `owner`'s `newest` tasks and every one still open; drops the rest (its oldest
    /// ended ones). Returns how many went.
    pub fn keep(&self, owner: &str, newest: usize) -> Result<usize, String> {
        self.with(|conn| {
            conn.execute(
                "DELETE FROM tasks WHERE owner = ?1 AND status IN ('completed', 'failed', 'cancelled')
                 AND id NOT IN (SELECT id FROM tasks WHERE owner = ?1 ORDER BY created_ms DESC, id LIMIT ?2)",
                params![owner, newest as i64],
            )
        })
    }
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(parent);
    }
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")?;
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str, owner: &str, run: &str, created_ms: i64) -> Row {
        Row {
            id: id.into(),
            owner: owner.into(),
            tool: "deploy".into(),
            via: "rest".into(),
            status: "working".into(),
            message: None,
            progress: None,
            approval: None,
            outcome: None,
            mcp_status: None,
            created_ms,
            updated_ms: created_ms,
            expires_ms: created_ms + 1000,
            run: run.into(),
        }
    }

    #[test]
    fn a_task_of_a_lost_run_reads_failed_and_an_expired_one_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("tasks.sqlite"));
        store.insert(&task("a", "", "old", 10)).unwrap();
        store.insert(&task("b", "", "new", 20)).unwrap();
        let mut done = task("c", "", "old", 30);
        done.status = "completed".into();
        store.insert(&done).unwrap();
        assert_eq!(store.fail_lost("new", "lost", 40).unwrap(), 1);
        let a = store.get("a", 50).unwrap().unwrap();
        assert_eq!((a.status.as_str(), a.message.as_deref()), ("failed", Some("lost")));
        assert_eq!(store.get("b", 50).unwrap().unwrap().status, "working");
        assert_eq!(store.get("c", 50).unwrap().unwrap().status, "completed");
        // Past its expiry a task is not answered, and a purge drops it once it ended: a task
        // still running keeps its row, where its end is written.
        assert_eq!(store.get("a", 1010).unwrap(), None);
        assert_eq!(store.purge(1025).unwrap(), 1);
        assert!(store.get("b", 0).unwrap().is_some() && store.get("c", 0).unwrap().is_some());
        assert_eq!(store.purge(1035).unwrap(), 1);
        assert!(store.get("c", 0).unwrap().is_none());
    }

    #[test]
    fn a_caller_keeps_its_newest_tasks_and_every_open_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("tasks.sqlite"));
        for (i, status) in ["completed", "working", "failed", "completed", "completed"].iter().enumerate() {
            let mut t = task(&format!("t{i}"), "alice", "r", i as i64);
            t.status = status.to_string();
            store.insert(&t).unwrap();
        }
        store.insert(&task("other", "bob", "r", 0)).unwrap();
        // The two newest stay; of the older ones only the open one does.
        assert_eq!(store.keep("alice", 2).unwrap(), 2);
        let ids: Vec<String> = store.list("alice", 0, 10).unwrap().into_iter().map(|t| t.id).collect();
        assert_eq!(ids, ["t4", "t3", "t1"]);
        assert_eq!(store.list("bob", 0, 10).unwrap().len(), 1);
    }

    #[test]
    fn a_caller_lists_only_its_own_tasks_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("tasks.sqlite"));
        store.insert(&task("a", "alice", "r", 10)).unwrap();
        store.insert(&task("b", "bob", "r", 20)).unwrap();
        store.insert(&task("c", "alice", "r", 30)).unwrap();
        let ids: Vec<String> = store.list("alice", 0, 10).unwrap().into_iter().map(|t| t.id).collect();
        assert_eq!(ids, ["c", "a"]);
        assert!(store.list("", 0, 10).unwrap().is_empty());
    }
}
