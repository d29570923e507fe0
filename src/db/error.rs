//! What can go wrong with the shared database, each saying what to do next. The driver's own
//! text is kept as the detail; its password never is (the driver does not print it, and a URL
//! is only ever shown redacted).

use std::error::Error as _;

use super::url::DbUrl;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("[db] url: {0}")]
    Url(String),
    #[error("{0}")]
    Tls(String),
    #[error("PostgreSQL at {address} cannot be reached ({detail}); check that it runs and that [db] url (or CTX_DATABASE_URL) names the right host and port")]
    Unreachable { address: String, detail: String },
    #[error("PostgreSQL at {address} refused user '{user}' ({detail}); check the user and password in [db] url, CTX_DATABASE_URL or PGPASSWORD")]
    Auth { address: String, user: String, detail: String },
    #[error("database '{dbname}' does not exist on {address}; create it (CREATE DATABASE {dbname} OWNER {user}) or fix [db] url")]
    NoDatabase { address: String, dbname: String, user: String },
    #[error("user '{user}' may not {what} ({detail}); {fix}")]
    Privilege { user: String, what: String, detail: String, fix: String },
    #[error("PostgreSQL {found} at {address} is too old: ctx needs PostgreSQL 14 or newer; upgrade it or point [db] url at a newer server")]
    TooOld { address: String, found: String },
    #[error("migration {component} {version} ({name}) failed: {detail}; nothing of it was written. {fix}")]
    Migration { component: String, version: i32, name: String, detail: String, fix: String },
    #[error("the database was migrated by a newer ctx: {component} is at version {found}, this ctx knows up to {known}; run that newer ctx (or a newer build) against it")]
    Newer { component: String, found: i32, known: i32 },
    #[error("the database is half migrated: ctx_migrations says {component} is at version {version}, but table {table} is missing (dropped, or a migration applied by hand); restore it from a backup, or, to start {component} afresh, DELETE FROM ctx_migrations WHERE component = '{component}' and restart")]
    HalfMigrated { component: String, version: i32, table: String },
    #[error("the database is unavailable ({0}); ctx reconnects by itself when it is back")]
    Unavailable(String),
    /// Every pooled connection is in use: the call may succeed later; the database is fine.
    #[error("the database is busy: {0}")]
    Busy(String),
    #[error("database: {0}")]
    Query(String),
}

impl DbError {
    /// The database could not be reached or answered in time: the call may succeed later, and
    /// the replica reports itself degraded meanwhile.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, DbError::Unavailable(_) | DbError::Unreachable { .. } | DbError::Busy(_))
    }

    /// A driver error, classified: a connection problem, a refusal of the login, a missing
    /// database or privilege, else a failed statement.
    pub fn from_driver(error: &tokio_postgres::Error, url: &DbUrl) -> DbError {
        use tokio_postgres::error::SqlState;
        let detail = detail(error);
        match error.code() {
            Some(c) if *c == SqlState::INVALID_PASSWORD || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION => {
                DbError::Auth { address: url.address(), user: url.user().to_string(), detail }
            }
            Some(c) if *c == SqlState::INVALID_CATALOG_NAME => DbError::NoDatabase {
                address: url.address(),
                dbname: url.dbname().to_string(),
                user: url.user().to_string(),
            },
            Some(c) if *c == SqlState::INSUFFICIENT_PRIVILEGE => DbError::Privilege {
                user: url.user().to_string(),
                what: "do what ctx asked".into(),
                detail,
                fix: privilege_fix(url),
            },
            Some(c)
                if *c == SqlState::ADMIN_SHUTDOWN
                    || *c == SqlState::CRASH_SHUTDOWN
                    || *c == SqlState::CANNOT_CONNECT_NOW
                    || *c == SqlState::TOO_MANY_CONNECTIONS =>
            {
                DbError::Unavailable(detail)
            }
            Some(_) => DbError::Query(detail),
            None if error.is_closed() => DbError::Unavailable(detail),
            // The server answered, but its certificate was not the one `sslmode` asks for.
            None if detail.contains("TLS") || detail.contains("certificate") => DbError::Tls(format!(
                "the TLS connection to {} failed ({detail}); with sslmode={}, set sslrootcert to the PEM file of the CA that signed the server's certificate, or use sslmode=require to encrypt without checking it",
                url.address(),
                url.ssl_mode.as_str()
            )),
            // No SQLSTATE and not closed: the connection could not be made (refused, timed
            // out) or broke while in use.
            None => DbError::Unreachable { address: url.address(), detail },
        }
    }
}

/// The grant that lets `url`'s user create ctx's tables. PostgreSQL 15 no longer lets every
/// user create tables in `public`.
pub(super) fn privilege_fix(url: &DbUrl) -> String {
    grant_create(url.user(), url.dbname())
}

/// The grant that lets `user` create ctx's tables in database `db`.
pub fn grant_create(user: &str, db: &str) -> String {
    format!(
        "as the database's owner or a superuser run GRANT CREATE ON SCHEMA public TO {user} (or make {user} the owner: ALTER DATABASE {db} OWNER TO {user})"
    )
}

/// The driver's error as one line: the server's message for a database error (its Display is
/// only "db error"), else the error and its causes.
pub fn detail(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        return format!("{} {}: {}", db.severity(), db.code().code(), db.message());
    }
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}
