//! Versioned migrations, the same way on both backends: each store names its component and the
//! ordered steps that build its tables, and a `ctx_migrations` table in the database (or the
//! SQLite file) records the steps applied. On PostgreSQL every pending step of every component
//! runs in one transaction under an advisory lock, so replicas starting together migrate once
//! and a failed step leaves nothing behind.

use super::error::{privilege_fix, DbError};
use super::pg::Pg;

/// One step of a component's schema.
#[derive(Debug)]
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// A store's tables on one backend: its steps in order, and the tables they make (checked to
/// exist once migrated, so a table dropped by hand is reported rather than failing each call).
#[derive(Debug)]
pub struct Component {
    pub name: &'static str,
    pub migrations: &'static [Migration],
    pub tables: &'static [&'static str],
}

impl Component {
    fn latest(&self) -> i32 {
        self.migrations.last().map_or(0, |m| m.version)
    }
}

/// The advisory lock migrations hold (`pg_advisory_xact_lock`), in one namespace with ctx's other
/// locks: the key is hashed with the schema, so two ctx deployments in different schemas of one
/// database do not wait for each other.
const LOCK: &str = "ctx migrations";

const PG_TABLE: &str = "CREATE TABLE IF NOT EXISTS ctx_migrations (
    component  TEXT NOT NULL,
    version    INT4 NOT NULL,
    name       TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (component, version)
)";

const SQLITE_TABLE: &str = "CREATE TABLE IF NOT EXISTS ctx_migrations (
    component  TEXT NOT NULL,
    version    INTEGER NOT NULL,
    name       TEXT NOT NULL,
    applied_ms INTEGER NOT NULL,
    PRIMARY KEY (component, version)
)";

/// What [`pg`] applied: `component version name` of each step.
pub type Applied = Vec<String>;

/// Brings every component up to date on PostgreSQL, all in one transaction.
pub async fn pg(db: &Pg, components: &[&Component]) -> Result<Applied, DbError> {
    let url = db.url().clone();
    let mut client = db.client().await?;
    let failed = |e: tokio_postgres::Error| DbError::from_driver(&e, &url);
    let tx = client.transaction().await.map_err(failed)?;
    tx.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || $1::text))", &[&LOCK])
        .await
        .map_err(failed)?;
    if let Err(e) = tx.batch_execute(PG_TABLE).await {
        return Err(match DbError::from_driver(&e, &url) {
            DbError::Privilege { user, detail, fix, .. } => {
                DbError::Privilege { user, what: "create tables in the database".into(), detail, fix }
            }
            other => other,
        });
    }
    let mut applied = Vec::new();
    for component in components {
        let found: Option<i32> = tx
            .query_one("SELECT max(version) FROM ctx_migrations WHERE component = $1::text", &[&component.name])
            .await
            .map_err(failed)?
            .get(0);
        let found = found.unwrap_or(0);
        if found > component.latest() {
            return Err(DbError::Newer { component: component.name.into(), found, known: component.latest() });
        }
        for step in component.migrations.iter().filter(|m| m.version > found) {
            if let Err(e) = tx.batch_execute(step.sql).await {
                return Err(step_failed(component, step, &e, &url));
            }
            tx.execute(
                "INSERT INTO ctx_migrations (component, version, name) VALUES ($1::text, $2::int4, $3::text)",
                &[&component.name, &step.version, &step.name],
            )
            .await
            .map_err(failed)?;
            applied.push(format!("{} {} {}", component.name, step.version, step.name));
        }
        for table in component.tables {
            let exists: bool =
                tx.query_one("SELECT to_regclass($1::text) IS NOT NULL", &[table]).await.map_err(failed)?.get(0);
            if !exists {
                return Err(DbError::HalfMigrated {
                    component: component.name.into(),
                    version: component.latest(),
                    table: (*table).into(),
                });
            }
        }
    }
    tx.commit().await.map_err(failed)?;
    Ok(applied)
}

fn step_failed(component: &Component, step: &Migration, error: &tokio_postgres::Error, url: &super::DbUrl) -> DbError {
    use tokio_postgres::error::SqlState;
    let detail = super::error::detail(error);
    let fix = match error.code() {
        Some(c) if *c == SqlState::DUPLICATE_TABLE || *c == SqlState::DUPLICATE_OBJECT => {
            "The database holds a table ctx did not record making (an older install, or a migration applied by hand). \
             Point [db] url at an empty database, or drop what the message names if it holds nothing you need"
                .into()
        }
        Some(c) if *c == SqlState::INSUFFICIENT_PRIVILEGE => privilege_fix(url),
        _ => "Fix what the message says and start ctx again".into(),
    };
    if error.code().is_none() {
        // The connection went away mid-step: not the step's fault.
        return DbError::from_driver(error, url);
    }
    DbError::Migration { component: component.name.into(), version: step.version, name: step.name.into(), detail, fix }
}

/// Brings one component of a SQLite file up to date, in one immediate transaction.
pub fn sqlite(conn: &mut rusqlite::Connection, component: &Component) -> rusqlite::Result<Result<(), DbError>> {
    let tx = rusqlite::Transaction::new(conn, rusqlite::TransactionBehavior::Immediate)?;
    tx.execute_batch(SQLITE_TABLE)?;
    let found: Option<i32> =
        tx.query_row("SELECT max(version) FROM ctx_migrations WHERE component = ?1", [component.name], |r| r.get(0))?;
    let found = found.unwrap_or(0);
    if found > component.latest() {
        return Ok(Err(DbError::Newer { component: component.name.into(), found, known: component.latest() }));
    }
    for step in component.migrations.iter().filter(|m| m.version > found) {
        tx.execute_batch(step.sql)?;
        tx.execute(
            "INSERT INTO ctx_migrations (component, version, name, applied_ms) VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![component.name, step.version, step.name, now_ms()],
        )?;
    }
    tx.commit()?;
    Ok(Ok(()))
}

fn now_ms() -> i64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}
