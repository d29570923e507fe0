//! A shared database that is wrong, on a real PostgreSQL: a bad URL, a wrong password, a user
//! without privileges, a half-applied migration. Each gets a clear error naming what to fix,
//! and nothing is written.

use crate::common::Workspace;

const CONFIG: &str = "[connectors.filesystem.docs]\nroot = \"docs\"\n";

/// A workspace whose every `ctx` runs with `CTX_DATABASE_URL = url`.
fn ctx_on(url: &str, args: &[&str]) -> crate::common::Run {
    let ws = Workspace::new(CONFIG);
    ws.write("docs/a.md", "# A\n\nalpha\n");
    crate::common::run_in_with(
        ws.path(),
        &[&["--config", "ctx.toml"], args].concat(),
        &[(ctx::db::URL_ENV, url.to_string())],
    )
}

/// The tables of the public schema, as the superuser sees them.
fn tables(db: &ctx::db::testing::TestDb) -> Vec<String> {
    let name = db.name.clone();
    let admin_url = std::env::var(ctx::db::testing::ADMIN_ENV).unwrap();
    let on_db = admin_url.rsplit_once('/').unwrap().0.to_string() + "/" + &name;
    let pg = ctx::db::testing::pool(ctx::db::DbUrl::parse(&on_db, None).unwrap());
    pg.run(|c| async move {
        let rows = c.query("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1", &[]).await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    })
    .unwrap()
}

/// Runs SQL as the superuser in the test's database.
fn as_superuser(db: &ctx::db::testing::TestDb, sql: &str) {
    let admin_url = std::env::var(ctx::db::testing::ADMIN_ENV).unwrap();
    let on_db = admin_url.rsplit_once('/').unwrap().0.to_string() + "/" + &db.name;
    let pg = ctx::db::testing::pool(ctx::db::DbUrl::parse(&on_db, None).unwrap());
    let sql = sql.to_string();
    pg.run(move |c| async move { c.batch_execute(&sql).await }).unwrap();
}

#[test]
fn a_url_that_is_not_postgresql_is_a_config_error_with_its_line() {
    let ws = Workspace::new("[db]\nurl = \"mysql://ctx@db/ctx\"\n");
    let check = ws.ctx(&["schema", "check"]);
    assert_eq!(check.code(), 2, "{}", check.stderr());
    assert!(check.stderr().contains("db.url (line 2): expected a postgres:// URL"), "{}", check.stderr());
    let sync = ws.ctx(&["sync"]);
    assert_eq!(sync.code(), 2, "{}", sync.stderr());
    // From the environment: the same check, and the password is never printed.
    let run = ctx_on("postgres://ctx:hunter2-secret@db/ctx?sslmode=sometimes", &["schema", "check"]);
    assert_eq!(run.code(), 2);
    assert!(run.stderr().contains("sslmode 'sometimes' is not one of"), "{}", run.stderr());
    assert!(!run.stderr().contains("hunter2-secret"), "{}", run.stderr());
}

#[test]
fn a_wrong_password_names_the_user_and_writes_nothing() {
    let Some(db) = ctx::db::testing::database() else { return };
    let wrong = db.url.replacen(&format!("{}:", db.name), &format!("{}:wrong-password-", db.name), 1);
    let run = ctx_on(&wrong, &["sync"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(run.stderr().contains(&format!("refused user '{}'", db.name)), "{}", run.stderr());
    assert!(run.stderr().contains("check the user and password"), "{}", run.stderr());
    assert!(!run.stderr().contains("wrong-password"), "{}", run.stderr());
    assert!(tables(&db).is_empty());
}

#[test]
fn a_user_without_privileges_is_told_the_grant_and_nothing_is_written() {
    let Some(db) = ctx::db::testing::database() else { return };
    // The database belongs to someone else; PostgreSQL 15 lets no other user create tables in
    // `public`, which is what a shared server's DBA often hands out.
    as_superuser(&db, &format!("ALTER DATABASE {0} OWNER TO postgres; ALTER SCHEMA public OWNER TO postgres; REVOKE CREATE ON SCHEMA public FROM PUBLIC", db.name));
    let check = ctx_on(&db.url, &["schema", "check"]);
    assert_eq!(check.code(), 2, "{}", check.stderr());
    assert!(check.stderr().contains(&format!("GRANT CREATE ON SCHEMA public TO {}", db.name)), "{}", check.stderr());
    let sync = ctx_on(&db.url, &["sync"]);
    assert_eq!(sync.code(), 1, "{}", sync.stderr());
    assert!(sync.stderr().contains(&format!("user '{}' may not create tables", db.name)), "{}", sync.stderr());
    assert!(tables(&db).is_empty(), "{:?}", tables(&db));
    // Granted, it works.
    as_superuser(&db, &format!("GRANT CREATE ON SCHEMA public TO {}", db.name));
    let sync = ctx_on(&db.url, &["sync"]);
    assert_eq!(sync.code(), 0, "{}", sync.stderr());
    assert!(tables(&db).contains(&"kb_documents".to_string()));
}

#[test]
fn a_table_ctx_did_not_make_stops_the_migration_and_leaves_nothing_behind() {
    let Some(db) = ctx::db::testing::database() else { return };
    as_superuser(&db, &format!("CREATE TABLE approvals (id TEXT); ALTER TABLE approvals OWNER TO {}", db.name));
    let run = ctx_on(&db.url, &["sync"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    let said = run.stderr();
    assert!(said.contains("migration approvals 1"), "{said}");
    assert!(said.contains("relation \"approvals\" already exists"), "{said}");
    assert!(said.contains("Point [db] url at an empty database"), "{said}");
    // One transaction: not even the bookkeeping table is left.
    assert_eq!(tables(&db), vec!["approvals"]);
}

#[test]
fn a_migration_recorded_without_its_tables_is_reported_half_applied() {
    let Some(db) = ctx::db::testing::database() else { return };
    assert_eq!(ctx_on(&db.url, &["sync"]).code(), 0);
    // Someone drops a table behind ctx's back.
    as_superuser(&db, "DROP TABLE approval_keys");
    let run = ctx_on(&db.url, &["sync"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    let said = run.stderr();
    assert!(said.contains("half migrated"), "{said}");
    assert!(said.contains("table approval_keys is missing"), "{said}");
    assert!(said.contains("DELETE FROM ctx_migrations WHERE component = 'approvals'"), "{said}");
    // Following the advice works: the component is made again.
    as_superuser(
        &db,
        "DROP TABLE approval_tokens, approvals; DELETE FROM ctx_migrations WHERE component = 'approvals'",
    );
    assert_eq!(ctx_on(&db.url, &["sync"]).code(), 0);
    assert!(tables(&db).contains(&"approval_keys".to_string()));
}

#[test]
fn a_database_migrated_by_a_newer_ctx_is_refused() {
    let Some(db) = ctx::db::testing::database() else { return };
    assert_eq!(ctx_on(&db.url, &["sync"]).code(), 0);
    as_superuser(&db, "INSERT INTO ctx_migrations (component, version, name) VALUES ('kb', 99, 'from the future')");
    let run = ctx_on(&db.url, &["search", "alpha"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(run.stderr().contains("migrated by a newer ctx: kb is at version 99"), "{}", run.stderr());
}
