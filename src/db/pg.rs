//! The pool of connections to PostgreSQL, whether the database answers now (for `/health`), and
//! the bridge by which the stores' synchronous methods (SQLite made them so) wait on it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime};

use super::error::DbError;
use super::url::DbUrl;

/// The oldest PostgreSQL ctx runs on, as `server_version_num`.
pub const MIN_VERSION_NUM: i32 = 140_000;

/// How ctx connects: `[db]`'s settings with its URL read.
#[derive(Clone, Debug)]
pub struct Settings {
    pub url: DbUrl,
    pub pool_size: usize,
    pub connect_timeout: Duration,
    pub statement_timeout: Duration,
}

/// A pool of connections to one database; cheap to clone.
#[derive(Clone)]
pub struct Pg(Arc<Inner>);

struct Inner {
    pool: Pool,
    settings: Settings,
    /// Whether the last use of the database failed for want of it.
    down: AtomicBool,
    last_error: Mutex<Option<String>>,
    /// The last probe's answer, and when it was asked.
    probed: tokio::sync::Mutex<Option<(std::time::Instant, Result<(), String>)>>,
}

/// How long one probe's answer serves every caller of [`Pg::probe`].
const PROBE_SHARED: Duration = Duration::from_secs(1);

/// What the server said of itself on [`Pg::check`].
#[derive(Clone, Debug)]
pub struct Server {
    pub version: String,
    pub version_num: i32,
    pub user: String,
    pub database: String,
}

impl Pg {
    /// A pool for `settings`; no connection is made until the first use.
    pub fn new(settings: Settings) -> Result<Pg, DbError> {
        let tls = super::tls::connector(&settings.url).map_err(DbError::Tls)?;
        let mut config = settings.url.config.clone();
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(settings.connect_timeout);
        }
        // Every statement is bounded on the server too: a stuck query cannot hold a pooled
        // connection (and so a caller) for ever.
        let timeout = format!("-c statement_timeout={}", settings.statement_timeout.as_millis());
        let options = match config.get_options() {
            Some(given) => format!("{given} {timeout}"),
            None => timeout,
        };
        config.options(&options);
        // A server that vanishes without closing the connection (a host down, a partition) is
        // noticed within about a minute, not the kernel's two hours.
        config.keepalives(true);
        config.keepalives_idle(Duration::from_secs(30));
        config.keepalives_interval(Duration::from_secs(10));
        config.keepalives_retries(3);
        config.tcp_user_timeout(Duration::from_secs(60));
        // A connection given back inside a transaction (a panic or a dropped future mid-way)
        // is rolled back, and any session lock it held let go, before anyone gets it again.
        let recycling = RecyclingMethod::Custom("ROLLBACK; SELECT pg_advisory_unlock_all()".into());
        let manager = Manager::from_config(config, tls, ManagerConfig { recycling_method: recycling });
        let wait = Some(settings.connect_timeout);
        let pool = Pool::builder(manager)
            .max_size(settings.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(wait)
            .create_timeout(wait)
            .recycle_timeout(wait)
            .build()
            .map_err(|e| DbError::Url(e.to_string()))?;
        Ok(Pg(Arc::new(Inner {
            pool,
            settings,
            down: AtomicBool::new(false),
            last_error: Mutex::new(None),
            probed: tokio::sync::Mutex::new(None),
        })))
    }

    pub fn url(&self) -> &DbUrl {
        &self.0.settings.url
    }

    pub fn settings(&self) -> &Settings {
        &self.0.settings
    }

    /// `None` while the database answers; else why it did not, the last time it was used.
    pub fn unavailable(&self) -> Option<String> {
        match self.0.down.load(Ordering::Acquire) {
            true => self.0.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            false => None,
        }
    }

    /// A connection from the pool (a new one when none is idle).
    pub async fn client(&self) -> Result<Object, DbError> {
        let got = self.0.pool.get().await;
        let client = match got {
            Ok(client) => client,
            Err(PoolError::Backend(e)) => return Err(self.saw(DbError::from_driver(&e, self.url()))),
            // Every connection busy: this replica's pool, not the database, is the limit.
            Err(PoolError::Timeout(deadpool_postgres::TimeoutType::Wait)) => {
                return Err(DbError::Busy(format!(
                    "all {} connections to {} stayed in use for {} ms; raise [db] pool_size",
                    self.0.settings.pool_size,
                    self.url().address(),
                    self.0.settings.connect_timeout.as_millis()
                )))
            }
            Err(PoolError::Timeout(_)) => {
                return Err(self.saw(DbError::Unavailable(format!(
                    "no connection to {} within {} ms",
                    self.url().address(),
                    self.0.settings.connect_timeout.as_millis()
                ))))
            }
            Err(other) => return Err(self.saw(DbError::Unavailable(other.to_string()))),
        };
        Ok(client)
    }

    /// Runs `work` on a pooled connection; a driver error comes back classified, and marks the
    /// database down when it is one of reaching it.
    pub async fn with<T, F, Fut>(&self, work: F) -> Result<T, DbError>
    where
        F: FnOnce(Object) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let client = self.client().await?;
        // The server bounds each statement (statement_timeout); this bounds the wait for a
        // server that stopped answering at all.
        let within = self.0.settings.statement_timeout + self.0.settings.connect_timeout;
        match tokio::time::timeout(within, work(client)).await {
            Ok(Ok(value)) => {
                self.saw_up();
                Ok(value)
            }
            Ok(Err(e)) => Err(self.saw(DbError::from_driver(&e, self.url()))),
            Err(_) => Err(self.saw(DbError::Unavailable(format!(
                "no answer from {} within {} ms",
                self.url().address(),
                within.as_millis()
            )))),
        }
    }

    /// [`Pg::with`] for synchronous code: waits on the process's runtime. Off the async workers
    /// (the blocking pool, a thread of ctx's own) it simply blocks; on a worker of a
    /// multi-threaded runtime it tells tokio first, so the other tasks move to another thread.
    pub fn run<T, F, Fut>(&self, work: F) -> Result<T, DbError>
    where
        T: Send + 'static,
        F: FnOnce(Object) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, tokio_postgres::Error>> + Send,
    {
        let pg = self.clone();
        block(async move { pg.with(work).await })
    }

    /// Connects and reads what the server is, refusing one older than PostgreSQL 14.
    pub async fn check(&self) -> Result<Server, DbError> {
        let row = self
            .with(|client| async move {
                client
                    .query_one(
                        "SELECT current_setting('server_version'), current_setting('server_version_num')::int4, \
                         current_user::text, current_database()::text",
                        &[],
                    )
                    .await
            })
            .await?;
        let server = Server { version: row.get(0), version_num: row.get(1), user: row.get(2), database: row.get(3) };
        if server.version_num < MIN_VERSION_NUM {
            return Err(DbError::TooOld { address: self.url().address(), found: server.version.clone() });
        }
        Ok(server)
    }

    /// Asks the database whether it answers, within `within`: `Err` with why not. Marks it
    /// down or up as it finds it, so a replica that was idle while it was away knows too.
    pub async fn probe(&self, within: Duration) -> Result<(), String> {
        // One probe a second however many ask (a load balancer, a flood of /health): the
        // others share its answer.
        let mut last = self.0.probed.lock().await;
        if let Some((_, answer)) = last.as_ref().filter(|(at, _)| at.elapsed() < PROBE_SHARED) {
            return answer.clone();
        }
        let answer = self.probe_now(within).await;
        *last = Some((std::time::Instant::now(), answer.clone()));
        answer
    }

    async fn probe_now(&self, within: Duration) -> Result<(), String> {
        let asked = self.with(|client| async move { client.simple_query("SELECT 1").await.map(drop) });
        match tokio::time::timeout(within, asked).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => {
                let late = DbError::Unavailable(format!(
                    "no answer from {} within {} ms",
                    self.url().address(),
                    within.as_millis()
                ));
                Err(self.saw(late).to_string())
            }
        }
    }

    /// A driver error of a connection from this pool, classified (and the database marked
    /// down when it is one of reaching it).
    pub fn classify(&self, error: &tokio_postgres::Error) -> DbError {
        self.saw(DbError::from_driver(error, self.url()))
    }

    fn saw(&self, error: DbError) -> DbError {
        // A busy pool is this replica's own limit: the database may be fine.
        if error.is_unavailable() && !matches!(error, DbError::Busy(_)) {
            *self.0.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(error.to_string());
            if !self.0.down.swap(true, Ordering::AcqRel) {
                tracing::warn!(database = %self.url(), "the database is unavailable: {error}");
            }
        }
        error
    }

    fn saw_up(&self) {
        if self.0.down.swap(false, Ordering::AcqRel) {
            tracing::info!(database = %self.url(), "the database answers again");
        }
    }
}

/// Waits for `future` from synchronous code (see [`Pg::run`]).
pub fn block<T: Send + 'static>(
    future: impl Future<Output = Result<T, DbError>> + Send + 'static,
) -> Result<T, DbError> {
    blocking(|| {
        crate::runtime::wait(future).unwrap_or_else(|| Err(DbError::Unavailable("ctx is shutting down".into())))
    })
}

/// Runs `f`, which may block on the database or on a lock held by code that waits for it, telling
/// tokio first when this thread is an async worker of a multi-threaded runtime. Without that, a
/// few such waits would hold every worker, and the query they wait for could never run.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_database_connects_as_its_own_role_on_postgresql_14_or_newer() {
        let Some(db) = crate::db::testing::database() else { return };
        let pg = db.pg();
        let server = block({
            let pg = pg.clone();
            async move { pg.check().await }
        })
        .expect("the check passes");
        assert!(server.version_num >= MIN_VERSION_NUM, "{server:?}");
        assert_eq!(server.user, db.name);
        assert_eq!(server.database, db.name);
        // TLS is on: the throwaway server offers it and `prefer` takes it.
        let ssl: bool = pg
            .run(|c| async move { c.query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).await })
            .unwrap()
            .get(0);
        assert!(ssl, "the connection is encrypted");
        assert!(pg.unavailable().is_none());
    }

    #[test]
    fn a_wrong_password_is_an_auth_error_that_names_the_user_and_not_the_password() {
        let Some(db) = crate::db::testing::database() else { return };
        let wrong = db.url.replacen(&format!("{}:", db.name), &format!("{}:not-the-password-", db.name), 1);
        let pg = crate::db::testing::pool(DbUrl::parse(&wrong, None).unwrap());
        let error = block(async move { pg.check().await }).unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, DbError::Auth { .. }), "{text}");
        assert!(text.contains(&db.name) && text.contains("password"), "{text}");
        assert!(!text.contains("not-the-password"), "{text}");
    }

    /// A stand-in for a PostgreSQL older than 14, which this machine cannot run: it speaks just
    /// enough of the wire protocol (trust login, one extended-protocol query) to answer the
    /// version check as PostgreSQL 13 would.
    fn old_server() -> u16 {
        use std::io::{Read, Write};
        fn message(kind: u8, body: &[u8]) -> Vec<u8> {
            let mut out = vec![kind];
            out.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
            out.extend_from_slice(body);
            out
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let Ok((mut stream, _)) = listener.accept() else { return };
            // The startup message: length, then the rest.
            let mut len = [0u8; 4];
            stream.read_exact(&mut len).unwrap();
            let mut startup = vec![0u8; i32::from_be_bytes(len) as usize - 4];
            stream.read_exact(&mut startup).unwrap();
            let mut hello = message(b'R', &0i32.to_be_bytes());
            hello.extend(message(b'S', b"server_version\x0013.9\x00"));
            hello.extend(message(b'K', &[0, 0, 0, 1, 0, 0, 0, 2]));
            hello.extend(message(b'Z', b"I"));
            stream.write_all(&hello).unwrap();
            let columns: [(&str, i32); 4] = [("v", 25), ("n", 23), ("u", 25), ("d", 25)];
            loop {
                let mut kind = [0u8; 1];
                if stream.read_exact(&mut kind).is_err() {
                    return;
                }
                stream.read_exact(&mut len).unwrap();
                let mut body = vec![0u8; i32::from_be_bytes(len) as usize - 4];
                stream.read_exact(&mut body).unwrap();
                let reply = match kind[0] {
                    b'P' => message(b'1', b""),
                    b'D' => {
                        let mut fields = (columns.len() as i16).to_be_bytes().to_vec();
                        for (name, oid) in columns {
                            fields.extend(name.as_bytes());
                            fields.push(0);
                            fields.extend(0i32.to_be_bytes());
                            fields.extend(0i16.to_be_bytes());
                            fields.extend(oid.to_be_bytes());
                            fields.extend(if oid == 23 { 4i16 } else { -1i16 }.to_be_bytes());
                            fields.extend((-1i32).to_be_bytes());
                            fields.extend(0i16.to_be_bytes());
                        }
                        let mut reply = message(b't', &0i16.to_be_bytes());
                        reply.extend(message(b'T', &fields));
                        reply
                    }
                    b'B' => message(b'2', b""),
                    b'E' => {
                        let values: [&[u8]; 4] = [b"13.9", &130009i32.to_be_bytes(), b"ctx", b"ctx"];
                        let mut row = (values.len() as i16).to_be_bytes().to_vec();
                        for value in values {
                            row.extend((value.len() as i32).to_be_bytes());
                            row.extend(value);
                        }
                        let mut reply = message(b'D', &row);
                        reply.extend(message(b'C', b"SELECT 1\x00"));
                        reply
                    }
                    b'S' => message(b'Z', b"I"),
                    _ => return,
                };
                stream.write_all(&reply).unwrap();
            }
        });
        port
    }

    #[test]
    fn a_postgresql_older_than_14_is_refused_saying_which_it_is() {
        let port = old_server();
        let url = DbUrl::parse(&format!("postgres://ctx@127.0.0.1:{port}/ctx?sslmode=disable"), None).unwrap();
        let pg = crate::db::testing::pool(url);
        let error = block(async move { pg.check().await }).unwrap_err();
        assert!(matches!(error, DbError::TooOld { .. }), "{error}");
        assert!(error.to_string().contains("PostgreSQL 13.9"), "{error}");
        assert!(error.to_string().contains("needs PostgreSQL 14 or newer"), "{error}");
    }

    #[test]
    fn a_server_that_is_not_there_is_unreachable_and_the_pool_says_so() {
        // A port nothing listens on: bound, then released.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = DbUrl::parse(&format!("postgres://ctx:pw@127.0.0.1:{port}/ctx?sslmode=disable"), None).unwrap();
        let pg = crate::db::testing::pool(url);
        let probe = pg.clone();
        let error = block(async move { probe.check().await }).unwrap_err();
        assert!(error.is_unavailable(), "{error}");
        assert!(error.to_string().contains(&format!("127.0.0.1:{port}")), "{error}");
        assert!(pg.unavailable().is_some(), "the pool remembers the database is down");
    }
}
