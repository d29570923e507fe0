//! The shared database of an application (`[db] url`): opened once per process, checked
//! (reachable, PostgreSQL 14 or newer, privileges), and brought up to date with every store's
//! migrations before anything else uses it. The stores' own tables are theirs; the list of
//! them is here, above every feature.

use std::sync::Arc;

use crate::config::Config;
use crate::db::migrate::Component;
use crate::db::{self, DbError, Pg, Shared};
use crate::kb::Kb;

/// Every store that keeps its state in the shared database, in the order they migrate.
pub fn components() -> Vec<&'static Component> {
    vec![
        &crate::approval::store::PG,
        &crate::calllog::store::PG,
        &crate::tasks::store::PG,
        &crate::tools::rate::PG,
        &crate::kb::pg_store::PG,
    ]
}

/// Who is opening the database: a server names itself by its port, a command by its process.
#[derive(Clone, Copy, Debug)]
pub enum Role {
    Server,
    Command,
}

/// The shared database `config` names, connected, checked and migrated; `None` for SQLite.
pub fn open(config: &Config, role: Role) -> Result<Option<Shared>, DbError> {
    let password = std::env::var("PGPASSWORD").ok();
    let Some(settings) = db::settings(&config.spec.db, password.as_deref())? else {
        return Ok(None);
    };
    let pg = Pg::new(settings)?;
    let ready = pg.clone();
    let applied = db::block(async move {
        ready.check().await?;
        db::migrate::pg(&ready, &components()).await
    })?;
    for step in &applied {
        tracing::info!(database = %pg.url(), "migrated: {step}");
    }
    let replica = match (&config.spec.db.replica, role) {
        (Some(name), _) => name.to_string(),
        (None, Role::Server) => {
            let bind = config.spec.server.bind.to_string();
            match bind.rsplit_once(':').map(|(_, port)| port) {
                // A port the kernel picks is no name: two such replicas of one host would share it.
                Some(port) if port != "0" => format!("{}:{port}", db::host_name()),
                _ => format!("{}:pid-{}", db::host_name(), std::process::id()),
            }
        }
        (None, Role::Command) => format!("{}:cli-{}", db::host_name(), std::process::id()),
    };
    Ok(Some(Shared { pg, replica: Arc::from(replica) }))
}

/// The knowledge base of `config`, with the shared database opened first when it names one.
pub fn open_kb(config: Arc<Config>, role: Role) -> anyhow::Result<Kb> {
    let shared = open(&config, role)?;
    Kb::open_shared(config, shared).map_err(|e| anyhow::Error::new(e).context("cannot open the knowledge base"))
}

/// What `ctx schema check` says of the database: `Ok(None)` without one, else a line on what
/// it is, or the problem. Nothing is written: pending migrations are counted, not applied.
pub fn check(config: &Config) -> Result<Option<String>, String> {
    let password = std::env::var("PGPASSWORD").ok();
    let settings = match db::settings(&config.spec.db, password.as_deref()) {
        Ok(None) => return Ok(None),
        Ok(Some(settings)) => settings,
        Err(e) => return Err(e.to_string()),
    };
    let pg = Pg::new(settings).map_err(|e| e.to_string())?;
    let url = pg.url().clone();
    let probe = pg.clone();
    let found = db::block(async move {
        let server = probe.check().await?;
        let pending = probe
            .with(|client| async move {
                // What the migrations would need: the right to create tables in the schema,
                // unless every table is there already.
                let row = client
                    .query_one(
                        "SELECT has_schema_privilege(current_schema(), 'CREATE'), to_regclass('ctx_migrations') IS NOT NULL",
                        &[],
                    )
                    .await?;
                let (can_create, has_table): (bool, bool) = (row.get(0), row.get(1));
                let mut pending = Vec::new();
                for component in components() {
                    let found: i32 = match has_table {
                        true => client
                            .query_one(
                                "SELECT coalesce(max(version), 0) FROM ctx_migrations WHERE component = $1::text",
                                &[&component.name],
                            )
                            .await?
                            .get(0),
                        false => 0,
                    };
                    let latest = component.migrations.last().map_or(0, |m| m.version);
                    if found < latest {
                        pending.push(format!("{} {found} -> {latest}", component.name));
                    }
                }
                Ok((can_create, pending))
            })
            .await?;
        Ok((server, pending))
    });
    let (server, (can_create, pending)) = found.map_err(|e| e.to_string())?;
    if !pending.is_empty() && !can_create {
        return Err(DbError::Privilege {
            user: server.user.clone(),
            what: format!("create ctx's tables in database {}", server.database),
            detail: format!("migrations to apply: {}", pending.join(", ")),
            fix: db::grant_create(&server.user, &server.database),
        }
        .to_string());
    }
    let migrations = match pending.is_empty() {
        true => "migrations up to date".to_string(),
        false => format!("migrations to apply at start: {}", pending.join(", ")),
    };
    Ok(Some(format!(
        "database: PostgreSQL {} at {} (database {}, user {}, sslmode {}); {migrations}",
        server.version,
        url.address(),
        server.database,
        server.user,
        url.ssl_mode.as_str()
    )))
}
