//! A small pool of SQLite connections, reused for the life of the process.
//!
//! `rusqlite::Connection` is `Send` but not `Sync`, so each blocking worker takes its own
//! connection. The lock only guards a `Vec` push/pop; queries never run under it, so concurrent
//! callers are not serialised.
//!
//! A thread gets back the connection it used last when it is idle. A connection's page cache
//! was allocated by the thread that filled it; when connections wander between threads, every
//! free goes back to another thread's malloc arena and takes that arena's lock, which measured
//! as 0.1–0.2 lock waits per search with several callers.

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread::ThreadId;

use rusqlite::{Connection, OpenFlags};

use super::KbError;

pub struct Pool {
    path: PathBuf,
    /// Idle connections, each with the thread that returned it.
    idle: Mutex<Vec<(ThreadId, Connection)>>,
    max_idle: usize,
    /// Run once on each new connection (per-connection temp tables).
    init: fn(&Connection) -> rusqlite::Result<()>,
}

impl Pool {
    pub fn new(path: &Path, max_idle: usize, init: fn(&Connection) -> rusqlite::Result<()>) -> Self {
        Self { path: path.to_path_buf(), idle: Mutex::new(Vec::new()), max_idle, init }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A connection from the pool (this thread's last one if it is idle), or a new one when all
    /// are in use.
    pub fn get(&self) -> Result<Pooled<'_>, KbError> {
        let me = std::thread::current().id();
        let idle = {
            let mut idle = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match idle.iter().rposition(|(owner, _)| *owner == me) {
                Some(at) => Some(idle.remove(at).1),
                None => idle.pop().map(|(_, conn)| conn),
            }
        };
        let conn = match idle {
            Some(conn) => conn,
            None => {
                let conn = open(&self.path)?;
                (self.init)(&conn)?;
                conn
            }
        };
        Ok(Pooled { pool: self, conn: Some(conn) })
    }
}

pub(super) fn open(path: &Path) -> Result<Connection, KbError> {
    let wrap = |source| KbError::Open { path: path.display().to_string(), source };
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(path, flags).map_err(wrap)?;
    conn.busy_timeout(std::time::Duration::from_secs(10)).map_err(wrap)?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = NORMAL;
         PRAGMA foreign_keys = ON;
         PRAGMA temp_store = MEMORY;
         PRAGMA cache_size = -16000;",
    )
    .map_err(wrap)?;
    // Sync and search together use more distinct statements than rusqlite's default cache of 16
    // holds; a statement that falls out of it is parsed again on its next use.
    conn.set_prepared_statement_cache_capacity(64);
    // Every 1000 VM steps: has a budgeted (inline) query on this thread run out of time?
    conn.progress_handler(1000, Some(super::budget::exceeded)).map_err(wrap)?;
    Ok(conn)
}

/// A checked-out connection; it goes back to the pool when dropped.
pub struct Pooled<'a> {
    pool: &'a Pool,
    conn: Option<Connection>,
}

impl Deref for Pooled<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn.as_ref().expect("present until drop")
    }
}

impl DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn.as_mut().expect("present until drop")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // A connection left inside a transaction (a panic mid-write) is not reused.
            if !conn.is_autocommit() {
                return;
            }
            let me = std::thread::current().id();
            let mut idle = self.pool.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if idle.len() < self.pool.max_idle {
                idle.push((me, conn));
            }
        }
    }
}
