//! Where a small store keeps its rows: a SQLite file opened on first use (and again after an
//! error), or the shared database. Approvals and tasks are both one or the other, statement by
//! statement.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::Connection;

use super::Pg;

/// A store's file or the shared database.
pub enum Place {
    File { path: PathBuf, conn: Mutex<Option<Connection>>, open: fn(&Path) -> rusqlite::Result<Connection> },
    Shared(Pg),
}

impl Place {
    /// The file at `path`, opened with `open` (which also migrates it) on first use.
    pub fn file(path: PathBuf, open: fn(&Path) -> rusqlite::Result<Connection>) -> Place {
        Place::File { path, conn: Mutex::new(None), open }
    }

    /// The file, when the rows are kept in one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Place::File { path, .. } => Some(path),
            Place::Shared(_) => None,
        }
    }

    /// The shared database, for what only it does.
    pub fn pg(&self) -> Option<&Pg> {
        match self {
            Place::Shared(pg) => Some(pg),
            Place::File { .. } => None,
        }
    }

    /// Runs `f` on the file's connection, or `g` on the shared database (`what` names the store
    /// in its errors). A connection that failed is opened again on the next use.
    pub fn either<T: Send + 'static, Fut>(
        &self,
        what: &str,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
        g: impl FnOnce(deadpool_postgres::Object) -> Fut + Send + 'static,
    ) -> Result<T, String>
    where
        Fut: Future<Output = Result<T, tokio_postgres::Error>> + Send,
    {
        match self {
            Place::File { path, conn, open } => {
                let mut slot = conn.lock().unwrap_or_else(|p| p.into_inner());
                if slot.is_none() {
                    *slot = Some(open(path).map_err(|e| format!("{}: {e}", path.display()))?);
                }
                let connection = slot.as_ref().expect("opened above");
                f(connection).map_err(|e| {
                    *slot = None;
                    format!("{}: {e}", path.display())
                })
            }
            Place::Shared(pg) => pg.run(g).map_err(|e| format!("{what}: {e}")),
        }
    }
}
