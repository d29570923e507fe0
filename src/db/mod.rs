//! The shared database. `[db] url` (or `CTX_DATABASE_URL`) names a PostgreSQL server that every
//! replica's state lives in: approvals, the call log, tasks, rate-limit buckets and the knowledge
//! base. Without it each store keeps its SQLite file beside the knowledge base, as on a laptop.
//!
//! This module knows the connection (URL, TLS, pool, timeouts, whether the server answers) and
//! the migrations' bookkeeping; each store owns its tables and SQL.

mod error;
pub mod migrate;
mod pg;
mod place;
#[doc(hidden)]
pub mod testing;
mod tls;
pub mod url;

use std::time::Duration;

pub use error::{detail, grant_create, DbError};
pub use pg::{block, blocking, Pg, Server, Settings, MIN_VERSION_NUM};
pub use place::Place;
pub use url::{DbUrl, SslMode};

/// The variable that overrides `[db] url`, so one config serves a laptop and a deployment.
pub const URL_ENV: &str = "CTX_DATABASE_URL";

/// `[db]` read into connection settings: `None` when no URL is set (SQLite). `password` is
/// libpq's `PGPASSWORD`, used when the URL carries none.
pub fn settings(spec: &crate::types::DbConfig, password: Option<&str>) -> Result<Option<Settings>, DbError> {
    let Some(url) = spec.url.as_deref().filter(|u| !u.trim().is_empty()) else {
        return Ok(None);
    };
    let url = DbUrl::parse(url, password).map_err(DbError::Url)?;
    Ok(Some(Settings {
        url,
        pool_size: spec.pool_size.max(1) as usize,
        connect_timeout: Duration::from_millis(spec.connect_timeout_ms.max(100) as u64),
        statement_timeout: Duration::from_millis(spec.statement_timeout_ms.max(100) as u64),
    }))
}

/// A replica's handle on the shared database: the pool, and the name this process goes by in
/// it (each call-log entry names the replica that served it; each task the one that runs it).
#[derive(Clone)]
pub struct Shared {
    pub pg: Pg,
    pub replica: std::sync::Arc<str>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shared({} as {})", self.pg.url(), self.replica)
    }
}

/// This machine's host name, for a replica's default name.
pub fn host_name() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer it is given.
    let ok = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) } == 0;
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    match ok {
        true if end > 0 => String::from_utf8_lossy(&buffer[..end]).into_owned(),
        _ => "localhost".into(),
    }
}
