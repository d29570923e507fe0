//! Tasks in SQLite (`tasks.sqlite` beside the knowledge base): a task's status and its
//! outcome outlive the process that ran it, for `[tasks] ttl_secs`. Or in the shared database,
//! where each task names the replica and run that runs it, a run proves it is alive by its
//! heartbeat (`task_runs`), and a cancel asked through another replica waits in the row for the
//! run's replica to act on it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

use crate::db::migrate::{Component, Migration};
use crate::db::{Pg, Place};

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

/// The SQLite file's table. Step 1 is what files made before versioned migrations hold, so it
/// applies to them as a no-op.
// Static: immutable, a store's migrations: SQL text compiled in, the same for every application.
static SQLITE: Component = Component {
    name: "tasks",
    migrations: &[Migration { version: 1, name: "the tasks", sql: SCHEMA }],
    tables: &["tasks"],
};

/// The tables in the shared database.
// Static: immutable, a store's migrations: SQL text compiled in, the same for every application.
pub static PG: Component = Component {
    name: "tasks",
    migrations: &[Migration {
        version: 1,
        name: "the tasks of every replica, their runs' heartbeats and cancels asked across replicas",
        sql: "
CREATE TABLE tasks (
    id                TEXT PRIMARY KEY,
    owner             TEXT NOT NULL,
    tool              TEXT NOT NULL,
    via               TEXT NOT NULL,
    status            TEXT NOT NULL,
    message           TEXT,
    progress          TEXT,
    approval          TEXT,
    outcome           TEXT,
    mcp_status        TEXT,
    created_ms        INT8 NOT NULL,
    updated_ms        INT8 NOT NULL,
    expires_ms        INT8 NOT NULL,
    run               TEXT NOT NULL,
    replica           TEXT NOT NULL,
    -- Set by a cancel through a replica that does not run the task; the run's replica sees it.
    cancel_requested  BOOL NOT NULL DEFAULT false
);
CREATE INDEX tasks_owner ON tasks(owner, created_ms);
CREATE INDEX tasks_expires ON tasks(expires_ms);
CREATE INDEX tasks_open ON tasks(status, run);
-- Each process run that keeps tasks, and when it last said it was alive: a task whose run has
-- not for a lease was lost.
CREATE TABLE task_runs (
    run_id        TEXT PRIMARY KEY,
    replica       TEXT NOT NULL,
    started_ms    INT8 NOT NULL,
    heartbeat_ms  INT8 NOT NULL
);
",
    }],
    tables: &["tasks", "task_runs"],
};

/// Where tasks are kept: one file, opened on first use, or the shared database.
pub struct Store {
    place: Place,
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
    /// The replica that runs it, in the shared database (empty in a file).
    pub replica: String,
}

const COLUMNS: &str = "id, owner, tool, via, status, message, progress, approval, outcome, mcp_status, created_ms, updated_ms, expires_ms, run";
const SELECT: &str = "SELECT id, owner, tool, via, status, message, progress, approval, outcome, mcp_status, created_ms, updated_ms, expires_ms, run FROM tasks";
/// The same columns without the outcome (up to `[tasks] max_result_bytes` each): what a list reads.
const SELECT_BRIEF: &str = "SELECT id, owner, tool, via, status, message, progress, approval, NULL, mcp_status, created_ms, updated_ms, expires_ms, run FROM tasks";

/// The statuses of a task that has not ended.
const OPEN: &str = "('working', 'input_required')";

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
        replica: String::new(),
    })
}

impl Store {
    pub fn new(path: PathBuf) -> Store {
        Store { place: Place::file(path, open) }
    }

    /// The tasks of the shared database (migrated by `app::database`).
    pub fn shared(pg: Pg) -> Store {
        Store { place: Place::Shared(pg) }
    }

    /// The SQLite file, when tasks are kept in one.
    pub fn path(&self) -> Option<&Path> {
        self.place.path()
    }

    /// Whether replicas share these tasks (the shared database).
    pub fn is_shared(&self) -> bool {
        self.place.pg().is_some()
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
        self.place.either("tasks", f, g)
    }

    /// The shared database, for what only it does.
    fn pg(&self) -> Option<&Pg> {
        self.place.pg()
    }

    pub fn insert(&self, task: &Row) -> Result<(), String> {
        let owned = task.clone();
        self.either(
            |conn| {
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
            },
            move |client| async move { pg::insert(&**client, &owned).await },
        )
    }

    /// Records `task` unless its owner runs `max_running` tasks already, on every replica
    /// (`Err` with how many), keeping the owner's newest `keep` ended ones. One transaction
    /// under a lock of the owner's: two replicas starting the owner's tasks at once count each
    /// other's. For the shared database only (a file's caps are counted in memory, by the one
    /// process that runs its tasks).
    pub fn insert_capped(
        &self,
        task: &Row,
        max_running: usize,
        keep: usize,
        now_ms: i64,
    ) -> Result<Result<(), usize>, String> {
        let Some(pg) = self.pg() else { return Err("insert_capped is for the shared database".into()) };
        let owned = task.clone();
        let (max_running, keep) = (max_running as i64, keep as i64);
        pg.run(move |mut client| async move {
            let tx = client.transaction().await?;
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtext(current_schema() || 'ctx tasks of ' || $1::text))",
                &[&owned.owner],
            )
            .await?;
            let running: i64 = tx
                .query_one(
                    &format!("SELECT count(*) FROM tasks WHERE owner = $1::text AND status IN {OPEN}"),
                    &[&owned.owner],
                )
                .await?
                .get(0);
            if running >= max_running {
                return Ok(Err(running as usize));
            }
            pg::purge(&*tx, now_ms).await?;
            pg::keep(&*tx, &owned.owner, keep).await?;
            pg::insert(&*tx, &owned).await?;
            tx.commit().await?;
            Ok(Ok(()))
        })
        .map_err(|e| format!("tasks: {e}"))
    }

    /// Writes a task's status, message, progress, approval and outcome. In the shared database
    /// only while it has not ended there: a task another replica failed as lost stays failed.
    pub fn update(&self, task: &Row) -> Result<(), String> {
        let owned = task.clone();
        self.either(
            |conn| {
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
            },
            move |client| async move {
                let t = &owned;
                client
                    .execute(
                        &format!(
                            "UPDATE tasks SET status = $2::text, message = $3::text, progress = $4::text, approval = $5::text,
                               outcome = $6::text, mcp_status = $7::text, updated_ms = $8::int8, expires_ms = $9::int8
                             WHERE id = $1::text AND status IN {OPEN}"
                        ),
                        &[
                            &t.id,
                            &t.status,
                            &t.message,
                            &t.progress,
                            &t.approval,
                            &t.outcome,
                            &t.mcp_status,
                            &t.updated_ms,
                            &t.expires_ms,
                        ],
                    )
                    .await?;
                Ok(())
            },
        )
    }

    /// The task `id`, unless it expired.
    pub fn get(&self, id: &str, now_ms: i64) -> Result<Option<Row>, String> {
        let owned = id.to_string();
        self.either(
            |conn| {
                conn.query_row(&format!("{SELECT} WHERE id = ?1 AND expires_ms > ?2"), params![id, now_ms], row)
                    .optional()
            },
            move |client| async move {
                let sql = format!("SELECT {COLUMNS}, replica FROM tasks WHERE id = $1::text AND expires_ms > $2::int8");
                Ok(client.query_opt(&sql, &[&owned, &now_ms]).await?.as_ref().map(pg::row))
            },
        )
    }

    /// `owner`'s tasks that have not expired, newest first.
    pub fn list(&self, owner: &str, now_ms: i64, limit: usize) -> Result<Vec<Row>, String> {
        let owned = owner.to_string();
        let limit = limit as i64;
        self.either(
            |conn| {
                let sql = format!(
                    "{SELECT_BRIEF} WHERE owner = ?1 AND expires_ms > ?2 ORDER BY created_ms DESC, id LIMIT ?3"
                );
                let mut statement = conn.prepare(&sql)?;
                let rows = statement.query_map(params![owner, now_ms, limit], row)?;
                rows.collect()
            },
            move |client| async move {
                let sql = "SELECT id, owner, tool, via, status, message, progress, approval, NULL, mcp_status,
                             created_ms, updated_ms, expires_ms, run, replica
                           FROM tasks WHERE owner = $1::text AND expires_ms > $2::int8
                           ORDER BY created_ms DESC, id LIMIT $3::int8";
                Ok(client.query(sql, &[&owned, &now_ms, &limit]).await?.iter().map(pg::row).collect())
            },
        )
    }

    /// Marks every task that another run left working or waiting as failed, with `why`: its run
    /// is gone, and nothing will end it. Returns how many. For a file, which one process at a
    /// time runs tasks from (the shared database has [`Store::fail_stale`]).
    pub fn fail_lost(&self, this_run: &str, why: &str, now_ms: i64) -> Result<usize, String> {
        if self.is_shared() {
            return Err("fail_lost would fail other replicas' tasks; use fail_stale".into());
        }
        self.either(
            |conn| {
                conn.execute(
                    "UPDATE tasks SET status = 'failed', message = ?2, updated_ms = ?3
                     WHERE status IN ('working', 'input_required') AND run != ?1",
                    params![this_run, why, now_ms],
                )
            },
            |_| async { Ok(0) },
        )
    }

    /// Says that run `run` of `replica` is alive at `now_ms` (shared database only).
    pub fn beat(&self, run: &str, replica: &str, now_ms: i64) -> Result<(), String> {
        let Some(pg) = self.pg() else { return Ok(()) };
        let (run, replica) = (run.to_string(), replica.to_string());
        pg.run(move |client| async move {
            client
                .execute(
                    // The database's clock, not this replica's: a replica whose clock is off
                    // must not look dead (or alive) to the others.
                    "INSERT INTO task_runs (run_id, replica, started_ms, heartbeat_ms)
                     VALUES ($1::text, $2::text, $3::int8, (extract(epoch FROM clock_timestamp()) * 1000)::int8)
                     ON CONFLICT (run_id) DO UPDATE SET heartbeat_ms = GREATEST(task_runs.heartbeat_ms, excluded.heartbeat_ms)",
                    &[&run, &replica, &now_ms],
                )
                .await
        })
        .map(drop)
        .map_err(|e| format!("tasks: {e}"))
    }

    /// Fails, with `why`, the open tasks of every run that has not said it was alive for
    /// `lease` (its replica stopped or lost the database), and forgets those runs. Any replica
    /// may sweep; a live run's tasks are left alone. Shared database only. Returns how many.
    pub fn fail_stale(&self, why: &str, now_ms: i64, lease: Duration) -> Result<usize, String> {
        let Some(pg) = self.pg() else { return Ok(0) };
        let why = why.to_string();
        let lease = lease.as_millis() as i64;
        pg.run(move |mut client| async move {
            let tx = client.transaction().await?;
            // Stale by the database's clock, which every heartbeat was written with.
            let stale: i64 = tx
                .query_one("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8 - $1::int8", &[&lease])
                .await?
                .get(0);
            let failed = tx
                .execute(
                    &format!(
                        "UPDATE tasks SET status = 'failed', message = $1::text, updated_ms = $2::int8
                         WHERE status IN {OPEN}
                           AND NOT EXISTS (SELECT 1 FROM task_runs r WHERE r.run_id = tasks.run AND r.heartbeat_ms > $3::int8)"
                    ),
                    &[&why, &now_ms, &stale],
                )
                .await?;
            tx.execute("DELETE FROM task_runs WHERE heartbeat_ms <= $1::int8", &[&stale]).await?;
            tx.commit().await?;
            Ok(failed as usize)
        })
        .map_err(|e| format!("tasks: {e}"))
    }

    /// Asks the replica that runs `owner`'s open task `id` to cancel it: `false` when there is
    /// no such task open (shared database only).
    pub fn request_cancel(&self, owner: &str, id: &str, now_ms: i64) -> Result<bool, String> {
        let Some(pg) = self.pg() else { return Ok(false) };
        let (owner, id) = (owner.to_string(), id.to_string());
        pg.run(move |client| async move {
            let asked = client
                .execute(
                    &format!(
                        "UPDATE tasks SET cancel_requested = true
                         WHERE id = $1::text AND owner = $2::text AND expires_ms > $3::int8 AND status IN {OPEN}"
                    ),
                    &[&id, &owner, &now_ms],
                )
                .await?;
            Ok(asked == 1)
        })
        .map_err(|e| format!("tasks: {e}"))
    }

    /// Of `ids`, the tasks run `run` should stop: a cancel was asked through another replica,
    /// or another replica found the run lost and failed them (shared database only).
    pub fn to_stop(&self, run: &str, ids: Vec<String>) -> Result<Vec<String>, String> {
        let Some(pg) = self.pg() else { return Ok(Vec::new()) };
        let run = run.to_string();
        pg.run(move |client| async move {
            let rows = client
                .query(
                    &format!(
                        "SELECT id FROM tasks WHERE id = ANY($1::text[]) AND run = $2::text
                           AND (cancel_requested OR status NOT IN {OPEN})"
                    ),
                    &[&ids, &run],
                )
                .await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
        .map_err(|e| format!("tasks: {e}"))
    }

    /// Drops the ended tasks past their expiry (a task still running keeps its row: its end
    /// is written there).
    pub fn purge(&self, now_ms: i64) -> Result<usize, String> {
        self.either(
            |conn| {
                conn.execute(
                    "DELETE FROM tasks WHERE expires_ms <= ?1 AND status IN ('completed', 'failed', 'cancelled')",
                    [now_ms],
                )
            },
            move |client| async move { pg::purge(&**client, now_ms).await },
        )
    }

    /// Keeps `owner`'s `newest` tasks and every one still open; drops the rest (its oldest
    /// ended ones). Returns how many went.
    pub fn keep(&self, owner: &str, newest: usize) -> Result<usize, String> {
        let owned = owner.to_string();
        self.either(
            |conn| {
                conn.execute(
                    "DELETE FROM tasks WHERE owner = ?1 AND status IN ('completed', 'failed', 'cancelled')
                     AND id NOT IN (SELECT id FROM tasks WHERE owner = ?1 ORDER BY created_ms DESC, id LIMIT ?2)",
                    params![owner, newest as i64],
                )
            },
            move |client| async move { pg::keep(&**client, &owned, newest as i64).await },
        )
    }
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
    Ok(conn)
}

/// The same statements for PostgreSQL.
mod pg {
    use tokio_postgres::GenericClient;

    use super::Row;

    pub(super) fn row(r: &tokio_postgres::Row) -> Row {
        Row {
            id: r.get(0),
            owner: r.get(1),
            tool: r.get(2),
            via: r.get(3),
            status: r.get(4),
            message: r.get(5),
            progress: r.get(6),
            approval: r.get(7),
            outcome: r.get(8),
            mcp_status: r.get(9),
            created_ms: r.get(10),
            updated_ms: r.get(11),
            expires_ms: r.get(12),
            run: r.get(13),
            replica: r.get(14),
        }
    }

    pub(super) async fn insert(client: &impl GenericClient, t: &Row) -> Result<(), tokio_postgres::Error> {
        client
            .execute(
                "INSERT INTO tasks (id, owner, tool, via, status, message, progress, approval, outcome, created_ms, updated_ms, expires_ms, run, replica)
                 VALUES ($1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, $8::text, $9::text,
                         $10::int8, $11::int8, $12::int8, $13::text, $14::text)",
                &[
                    &t.id,
                    &t.owner,
                    &t.tool,
                    &t.via,
                    &t.status,
                    &t.message,
                    &t.progress,
                    &t.approval,
                    &t.outcome,
                    &t.created_ms,
                    &t.updated_ms,
                    &t.expires_ms,
                    &t.run,
                    &t.replica,
                ],
            )
            .await?;
        Ok(())
    }

    pub(super) async fn purge(client: &impl GenericClient, now_ms: i64) -> Result<usize, tokio_postgres::Error> {
        let n = client
            .execute(
                "DELETE FROM tasks WHERE expires_ms <= $1::int8 AND status IN ('completed', 'failed', 'cancelled')",
                &[&now_ms],
            )
            .await?;
        Ok(n as usize)
    }

    pub(super) async fn keep(
        client: &impl GenericClient,
        owner: &str,
        newest: i64,
    ) -> Result<usize, tokio_postgres::Error> {
        let n = client
            .execute(
                "DELETE FROM tasks WHERE owner = $1::text AND status IN ('completed', 'failed', 'cancelled')
                 AND id NOT IN (SELECT id FROM tasks WHERE owner = $1::text ORDER BY created_ms DESC, id LIMIT $2::int8)",
                &[&owner, &newest],
            )
            .await?;
        Ok(n as usize)
    }
}

/// Runs `test` on a tasks file, then on the tasks of a fresh PostgreSQL database (when the
/// tests have a server; see `db::testing`). The second argument names the backend, for messages.
#[cfg(test)]
pub(crate) fn each_backend(mut test: impl FnMut(Store, &str)) {
    let dir = tempfile::tempdir().unwrap();
    test(Store::new(dir.path().join("tasks.sqlite")), "sqlite");
    if let Some(db) = crate::db::testing::database() {
        test(Store::shared(migrated(&db)), "postgres");
    }
}

#[cfg(test)]
pub(crate) fn migrated(db: &crate::db::testing::TestDb) -> Pg {
    let pg = db.pg();
    let migrating = pg.clone();
    crate::db::block(async move { crate::db::migrate::pg(&migrating, &[&PG]).await }).expect("migrations apply");
    pg
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
            replica: String::new(),
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
    fn an_expired_task_is_gone_and_a_purge_keeps_the_open_ones_on_either_backend() {
        each_backend(|store, backend| {
            store.insert(&task("b", "", "r", 20)).unwrap();
            let mut done = task("c", "", "r", 30);
            done.status = "completed".into();
            store.insert(&done).unwrap();
            assert_eq!(store.get("c", 1030).unwrap(), None, "{backend}");
            assert_eq!(store.purge(1035).unwrap(), 1, "{backend}");
            assert!(store.get("b", 0).unwrap().is_some(), "{backend}");
            assert!(store.get("c", 0).unwrap().is_none(), "{backend}");
        });
    }

    #[test]
    fn a_caller_keeps_its_newest_tasks_and_every_open_one() {
        each_backend(|store, backend| {
            for (i, status) in ["completed", "working", "failed", "completed", "completed"].iter().enumerate() {
                let mut t = task(&format!("t{i}"), "alice", "r", i as i64);
                t.status = status.to_string();
                store.insert(&t).unwrap();
            }
            store.insert(&task("other", "bob", "r", 0)).unwrap();
            // The two newest stay; of the older ones only the open one does.
            assert_eq!(store.keep("alice", 2).unwrap(), 2, "{backend}");
            let ids: Vec<String> = store.list("alice", 0, 10).unwrap().into_iter().map(|t| t.id).collect();
            assert_eq!(ids, ["t4", "t3", "t1"], "{backend}");
            assert_eq!(store.list("bob", 0, 10).unwrap().len(), 1, "{backend}");
        });
    }

    #[test]
    fn a_caller_lists_only_its_own_tasks_newest_first() {
        each_backend(|store, backend| {
            store.insert(&task("a", "alice", "r", 10)).unwrap();
            store.insert(&task("b", "bob", "r", 20)).unwrap();
            store.insert(&task("c", "alice", "r", 30)).unwrap();
            let ids: Vec<String> = store.list("alice", 0, 10).unwrap().into_iter().map(|t| t.id).collect();
            assert_eq!(ids, ["c", "a"], "{backend}");
            assert!(store.list("", 0, 10).unwrap().is_empty(), "{backend}");
        });
    }

    #[test]
    fn an_update_writes_the_status_and_outcome_on_either_backend() {
        each_backend(|store, backend| {
            let mut t = task("a", "alice", "r", 10);
            store.insert(&t).unwrap();
            t.status = "completed".into();
            t.outcome = Some("{\"rest_status\":200}".into());
            t.mcp_status = Some("completed".into());
            t.updated_ms = 20;
            store.update(&t).unwrap();
            let read = store.get("a", 0).unwrap().unwrap();
            assert_eq!((read.status.as_str(), read.outcome.as_deref()), ("completed", t.outcome.as_deref()));
            assert_eq!((read.mcp_status.as_deref(), read.updated_ms), (Some("completed"), 20), "{backend}");
        });
    }

    #[test]
    fn a_run_whose_heartbeat_stopped_loses_its_tasks_to_another_replicas_sweep_and_a_live_run_keeps_them() {
        let Some(db) = crate::db::testing::database() else { return };
        let (a, b) = (Store::shared(migrated(&db)), Store::shared(db.pg()));
        // Heartbeats carry the database's clock: a short lease, and real time.
        let lease = Duration::from_millis(800);
        let t0 = 1_000_000;
        a.beat("run-a", "host-a", t0).unwrap();
        b.beat("run-b", "host-b", t0).unwrap();
        let open = |id: &str, run: &str, replica: &str| {
            let row = Row { replica: replica.into(), expires_ms: t0 + 3_600_000, ..task(id, "alice", run, t0) };
            a.insert(&row).unwrap();
        };
        open("of-a", "run-a", "host-a");
        open("of-b", "run-b", "host-b");
        // Within the lease nothing is lost, whoever sweeps.
        assert_eq!(b.fail_stale("lost", t0 + 10_000, lease).unwrap(), 0);
        // B keeps beating; A stops. Past A's lease, B's sweep fails A's task and only it.
        std::thread::sleep(lease + Duration::from_millis(200));
        b.beat("run-b", "host-b", t0 + 40_000).unwrap();
        assert_eq!(b.fail_stale("its replica stopped", t0 + 41_000, lease).unwrap(), 1);
        let lost = b.get("of-a", t0).unwrap().unwrap();
        assert_eq!((lost.status.as_str(), lost.message.as_deref()), ("failed", Some("its replica stopped")));
        assert_eq!(b.get("of-b", t0).unwrap().unwrap().status, "working");
        // A's run, back, learns it should stop that task; its late writes do not revive it.
        assert_eq!(a.to_stop("run-a", vec!["of-a".into()]).unwrap(), ["of-a"]);
        a.update(&Row { status: "completed".into(), ..lost.clone() }).unwrap();
        assert_eq!(a.get("of-a", t0).unwrap().unwrap().status, "failed");
    }

    #[test]
    fn a_cancel_asked_through_one_replica_is_seen_by_the_run_of_another() {
        let Some(db) = crate::db::testing::database() else { return };
        let (a, b) = (Store::shared(migrated(&db)), Store::shared(db.pg()));
        let row = Row { replica: "host-a".into(), expires_ms: i64::MAX, ..task("t", "alice", "run-a", 10) };
        a.insert(&row).unwrap();
        assert_eq!(b.get("t", 20).unwrap().unwrap().replica, "host-a");
        assert!(a.to_stop("run-a", vec!["t".into()]).unwrap().is_empty());
        assert!(!b.request_cancel("bob", "t", 20).unwrap(), "another caller's task is not found");
        assert!(b.request_cancel("alice", "t", 20).unwrap());
        assert_eq!(a.to_stop("run-a", vec!["t".into()]).unwrap(), ["t"]);
        assert!(a.to_stop("run-other", vec!["t".into()]).unwrap().is_empty());
    }

    #[test]
    fn the_running_cap_counts_every_replicas_tasks_in_the_database() {
        let Some(db) = crate::db::testing::database() else { return };
        let (a, b) = (Store::shared(migrated(&db)), Store::shared(db.pg()));
        let row = |id: &str, replica: &str| Row { replica: replica.into(), ..task(id, "alice", replica, 10) };
        assert_eq!(a.insert_capped(&row("1", "a"), 2, 100, 0).unwrap(), Ok(()));
        assert_eq!(b.insert_capped(&row("2", "b"), 2, 100, 0).unwrap(), Ok(()));
        assert_eq!(a.insert_capped(&row("3", "a"), 2, 100, 0).unwrap(), Err(2));
        let other = Row { owner: "bob".into(), ..row("4", "b") };
        assert_eq!(b.insert_capped(&other, 2, 100, 0).unwrap(), Ok(()), "each owner has a cap of its own");
    }
}
