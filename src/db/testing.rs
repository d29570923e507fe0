//! Databases for tests: each test gets a database and a role of its own (not a superuser, as in
//! a deployment) on the throwaway PostgreSQL that `scripts/pg up` starts and `scripts/test`
//! names in `CTX_TEST_DATABASE_URL` (a superuser's URL). Dropped with the value.

use std::time::Duration;

use super::{DbUrl, Pg, Settings};

/// The variable `scripts/test` sets to the throwaway server's superuser URL.
pub const ADMIN_ENV: &str = "CTX_TEST_DATABASE_URL";

/// A database of one test.
pub struct TestDb {
    /// `postgres://role:password@127.0.0.1:port/database` of the test's own role.
    pub url: String,
    pub name: String,
    admin: Pg,
}

/// The throwaway server's superuser pool, or `None` outside `scripts/test` (the test is
/// skipped, saying so). In CI a missing server fails the test.
pub fn admin() -> Option<Pg> {
    let Ok(url) = std::env::var(ADMIN_ENV) else {
        if std::env::var_os("CI").is_some() {
            panic!("{ADMIN_ENV} is not set; CI must run the suite through scripts/test, which starts PostgreSQL");
        }
        eprintln!(
            "skipped: no PostgreSQL for the tests ({ADMIN_ENV} unset); run scripts/test, or eval \"$(scripts/pg up)\""
        );
        return None;
    };
    let url = DbUrl::parse(&url, None).expect("CTX_TEST_DATABASE_URL parses");
    Some(pool(url))
}

/// A pool with the tests' settings.
pub fn pool(url: DbUrl) -> Pg {
    Pg::new(Settings {
        url,
        pool_size: 4,
        connect_timeout: Duration::from_secs(5),
        statement_timeout: Duration::from_secs(30),
    })
    .expect("the pool builds")
}

/// A fresh database owned by a fresh role, or `None` when the tests have no server.
pub fn database() -> Option<TestDb> {
    let admin_url = std::env::var(ADMIN_ENV).ok();
    let admin = admin()?;
    Some(database_on(admin, &admin_url.expect("admin() checked it")))
}

/// A fresh database and role on the server `admin` (a superuser's pool at `admin_url`).
pub fn database_on(admin: Pg, admin_url: &str) -> TestDb {
    let name = format!("ctx_t_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let password = uuid::Uuid::new_v4().simple().to_string();
    let sql = format!("CREATE ROLE {name} LOGIN PASSWORD '{password}'");
    let create = format!("CREATE DATABASE {name} OWNER {name}");
    let (a, b) = (sql.clone(), create.clone());
    admin
        .run(move |c| async move {
            c.batch_execute(&a).await?;
            // CREATE DATABASE cannot run in a transaction block: a statement of its own.
            c.batch_execute(&b).await
        })
        .expect("the test's role and database are made");
    let address = admin_url.rsplit_once('@').map(|(_, rest)| rest.split('/').next().unwrap_or("")).unwrap_or("");
    let url = format!("postgres://{name}:{password}@{address}/{name}");
    TestDb { url, name, admin }
}

impl TestDb {
    /// A pool connected as the test's role.
    pub fn pg(&self) -> Pg {
        pool(DbUrl::parse(&self.url, None).expect("the test URL parses"))
    }

    /// The superuser's pool, for what a test does behind ctx's back.
    pub fn admin(&self) -> &Pg {
        &self.admin
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let (db, role) = (
            format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            format!("DROP ROLE IF EXISTS {}", self.name),
        );
        let _ = self.admin.run(move |c| async move {
            c.batch_execute(&db).await?;
            c.batch_execute(&role).await
        });
    }
}
