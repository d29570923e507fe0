//! Shared helpers: a temporary workspace and a way to run the real binary in it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_ctx");

/// The repository root (for shipped examples and tools).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A temporary folder with a `ctx.toml`; on SQLite, or on a PostgreSQL database of its own
/// (every `ctx` it runs gets `CTX_DATABASE_URL`).
pub struct Workspace {
    pub dir: tempfile::TempDir,
    pub shared: Option<ctx::db::testing::TestDb>,
}

impl Workspace {
    pub fn new(config: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("ctx.toml"), config).expect("write ctx.toml");
        Self { dir, shared: None }
    }

    /// [`Workspace::new`] on a fresh PostgreSQL database; `None` when the tests have no server.
    pub fn on_postgres(config: &str) -> Option<Self> {
        let shared = ctx::db::testing::database()?;
        Some(Self { shared: Some(shared), ..Self::new(config) })
    }

    /// Runs `test` in a workspace of `config` on each backend: SQLite, then PostgreSQL (when
    /// the tests have a server). `backend` names it for messages.
    pub fn each_backend(config: &str, test: impl Fn(&Workspace, &str)) {
        test(&Self::new(config), "sqlite");
        if let Some(ws) = Self::on_postgres(config) {
            test(&ws, "postgres");
        }
    }

    /// The variables every `ctx` of this workspace runs with.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        self.shared.iter().map(|db| (ctx::db::URL_ENV, db.url.clone())).collect()
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `ctx init --sample` (the README's workspace: sample corpus, echo tool, example agents),
    /// synced.
    pub fn sample() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        run_in(dir.path(), &["init", "--sample", "."]).ok();
        let ws = Self { dir, shared: None };
        ws.ctx(&["sync"]).ok();
        ws
    }

    /// Writes a file (creating folders) relative to the workspace.
    pub fn write(&self, rel: &str, text: &str) {
        let path = self.path().join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    /// Runs `ctx --config ctx.toml <args>` inside the workspace.
    pub fn ctx(&self, args: &[&str]) -> Run {
        run_in_with(self.path(), &[&["--config", "ctx.toml"], args].concat(), &self.env())
    }

    /// The knowledge base's SQLite file: on PostgreSQL, the replica's copy of it, which holds
    /// the same rows once a command has caught it up.
    pub fn db(&self) -> rusqlite::Connection {
        let file = if self.shared.is_some() { "data/replica-kb.sqlite" } else { "data/ctx.sqlite" };
        rusqlite::Connection::open(self.path().join(file)).expect("open db")
    }
}

/// Runs the binary in `dir` with `args`, without inheriting CTX_CONFIG.
pub fn run_in(dir: &Path, args: &[&str]) -> Run {
    run_in_with(dir, args, &[])
}

/// [`run_in`] with more variables set.
pub fn run_in_with(dir: &Path, args: &[&str], env: &[(&str, String)]) -> Run {
    let output = Command::new(BIN)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir(dir)
        // `ctx init` configures a local model it finds installed; tests get none unless asked.
        .env("CTX_MODEL_DIR", "/nonexistent/ctx-test-model")
        .env_remove("CTX_CONFIG")
        .env_remove("CTX_LOG")
        .output()
        .expect("run ctx");
    Run(output)
}

pub struct Run(pub Output);

impl Run {
    pub fn code(&self) -> i32 {
        self.0.status.code().unwrap_or(-1)
    }
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.0.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.0.stderr).into_owned()
    }
    /// Asserts exit 0 and returns stdout.
    #[track_caller]
    pub fn ok(&self) -> String {
        assert_eq!(self.code(), 0, "stdout:\n{}\nstderr:\n{}", self.stdout(), self.stderr());
        self.stdout()
    }
    /// Parses stdout as JSON after asserting success.
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.ok()).expect("stdout is JSON")
    }
}

/// One request a [`stub`] server received.
#[derive(Clone, Debug)]
pub struct StubRequest {
    pub method: String,
    pub path: String,
    /// Lower-case header names.
    pub headers: std::collections::BTreeMap<String, String>,
    pub body: String,
}

/// Requests a stub received, in order.
pub type Received = std::sync::Arc<std::sync::Mutex<Vec<StubRequest>>>;

/// A local HTTP server standing in for a SaaS API: records every request and answers with
/// `reply(request) -> (status, JSON body)`.
pub fn stub(reply: impl Fn(&StubRequest) -> (u16, String) + Send + Sync + 'static) -> (std::net::SocketAddr, Received) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind stub");
    let addr = listener.local_addr().expect("addr");
    let received: Received = Default::default();
    let log = received.clone();
    let reply = std::sync::Arc::new(reply);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let (log, reply) = (log.clone(), reply.clone());
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let pos = loop {
                    let n = stream.read(&mut chunk).unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break pos;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..pos]).into_owned();
                let mut lines = head.lines();
                let mut first = lines.next().unwrap_or_default().split_whitespace();
                let (method, path) =
                    (first.next().unwrap_or_default().to_string(), first.next().unwrap_or_default().to_string());
                let headers: std::collections::BTreeMap<String, String> = lines
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                    .collect();
                let len: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
                while buf.len() < pos + 4 + len {
                    let n = stream.read(&mut chunk).unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body = String::from_utf8_lossy(&buf[pos + 4..]).into_owned();
                let request = StubRequest { method, path, headers, body };
                let (status, text) = reply(&request);
                log.lock().unwrap().push(request);
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
            });
        }
    });
    (addr, received)
}

/// The Python interpreter of the venv that `scripts/test-env` builds with the official clients.
///
/// `scripts/test` always sets it, so in CI a missing venv fails the test. A bare `cargo test`
/// outside CI skips the client runs and says how to enable them.
pub fn test_python() -> Option<PathBuf> {
    match std::env::var_os("CTX_TEST_PYTHON") {
        Some(path) => {
            let path = PathBuf::from(path);
            assert!(path.exists(), "CTX_TEST_PYTHON={} does not exist; run scripts/test-env", path.display());
            Some(path)
        }
        None if std::env::var_os("CI").is_some() => {
            panic!("CTX_TEST_PYTHON is not set; CI must run the suite through scripts/test")
        }
        None => {
            eprintln!("skipping a third-party client run: eval \"$(scripts/test-env)\" enables it");
            None
        }
    }
}

/// The folder of the default embedding model that `scripts/test-env` installs
/// (`CTX_TEST_MODEL`). Like [`test_python`], a missing variable fails the test in CI and skips
/// the run elsewhere.
pub fn test_model() -> Option<PathBuf> {
    match std::env::var_os("CTX_TEST_MODEL") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            assert!(
                dir.join("model.safetensors").exists(),
                "CTX_TEST_MODEL={}: no model; run scripts/test-env",
                dir.display()
            );
            Some(dir)
        }
        None if std::env::var_os("CI").is_some() => {
            panic!("CTX_TEST_MODEL is not set; CI must run the suite through scripts/test")
        }
        None => {
            eprintln!("skipping a run with the default embedding model: eval \"$(scripts/test-env)\" enables it");
            None
        }
    }
}

/// A real upstream MCP server's command line from `scripts/test-env` (`CTX_TEST_EVERYTHING`,
/// `CTX_TEST_TIME_SERVER`): words separated by spaces. Like [`test_python`], a missing variable
/// fails the test in CI and skips the run elsewhere.
pub fn test_command(var: &str) -> Option<Vec<String>> {
    match std::env::var(var) {
        Ok(line) => {
            let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
            assert!(!words.is_empty(), "{var} is empty; run scripts/test-env");
            assert!(Path::new(&words[0]).exists(), "{var}: {} does not exist; run scripts/test-env", words[0]);
            Some(words)
        }
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!("{var} is not set; CI must run the suite through scripts/test")
        }
        Err(_) => {
            eprintln!("skipping a real upstream server run: eval \"$(scripts/test-env)\" enables it");
            None
        }
    }
}

/// Starts `ctx sync` in `ws` and kills it (-9) once the first documents are committed.
/// Returns how many it saw committed and whether the sync was still running when killed: a
/// sync that finished first proves nothing about a kill.
pub fn kill_mid_sync(ws: &Workspace) -> (i64, bool) {
    use std::time::{Duration, Instant};
    let mut child = Command::new(BIN)
        .args(["--config", "ctx.toml", "sync", "--json"])
        .current_dir(ws.path())
        .env("CTX_MODEL_DIR", "/nonexistent/ctx-test-model")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn ctx sync");
    let started = Instant::now();
    let mut seen = 0i64;
    while started.elapsed() < Duration::from_secs(60) {
        if let Ok(db) = rusqlite::Connection::open(ws.path().join("data/ctx.sqlite")) {
            seen = db.query_row("SELECT COUNT(*) FROM documents", [], |r| r.get(0)).unwrap_or(0);
            if seen > 0 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let running = child.try_wait().expect("try_wait").is_none();
    child.kill().expect("kill");
    child.wait().expect("wait");
    (seen, running)
}

/// Runs a program to completion and fails the test with its output unless it succeeds.
pub fn run_ok(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{command:?} failed ({}):\n{text}", output.status);
    text
}

/// The address (`127.0.0.1:PORT`) a `ctx serve` child prints on its first stdout line, or the
/// line itself when it names none. The rest of its stdout is drained in the background.
pub fn listening_address(child: &mut std::process::Child) -> Result<String, String> {
    use std::io::BufRead;
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("ctx serve with piped stdout"));
    let mut first = String::new();
    stdout.read_line(&mut first).map_err(|e| e.to_string())?;
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .map(|a| a.trim_end_matches('/').to_string())
        .ok_or(first)
}

/// Loads the workspace's ctx.toml with an injected environment (`vars` only), as `ctx` would read
/// it.
pub fn load_config(ws: &Workspace, vars: &[(&str, &str)]) -> Result<ctx::config::Config, ctx::config::ConfigError> {
    let vars: std::collections::BTreeMap<String, String> =
        vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let env = move |name: &str| vars.get(name).cloned();
    let file = ws.path().join("ctx.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    ctx::config::Config::from_text(&text, std::path::Path::new("ctx.toml"), &file, &env)
}

/// Starts `command` (a `ctx serve` on `127.0.0.1:0`, its arguments given) in `dir`, with no
/// `CTX_CONFIG` or `CTX_LOG` from the test's environment and its log dropped, and waits for the
/// address it listens on.
pub fn spawn_listening(
    command: &mut std::process::Command,
    dir: &std::path::Path,
) -> (std::process::Child, std::net::SocketAddr) {
    use std::process::Stdio;
    let mut child = command
        .current_dir(dir)
        .env_remove("CTX_CONFIG")
        .env_remove("CTX_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ctx serve");
    let addr = listening_address(&mut child)
        .unwrap_or_else(|line| panic!("no address in {line:?}"))
        .parse()
        .expect("an address");
    (child, addr)
}

/// Collects a child's stderr in the background (a server's log, read by the test as it goes).
pub fn collect_stderr(child: &mut std::process::Child) -> std::sync::Arc<std::sync::Mutex<String>> {
    use std::io::Read;
    let collected: std::sync::Arc<std::sync::Mutex<String>> = Default::default();
    let (mut err, sink) = (child.stderr.take().expect("a child with piped stderr"), std::sync::Arc::clone(&collected));
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    collected
}

/// A `ctx serve` child on 127.0.0.1:0: its address, its stderr as collected so far; killed and
/// reaped on drop.
pub struct ServeChild {
    pub child: std::process::Child,
    pub addr: String,
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl ServeChild {
    /// Spawns `command` (a `ctx ... serve --bind 127.0.0.1:0`; its stdout and stderr are piped
    /// here) and waits for the address it prints.
    pub fn spawn(command: &mut std::process::Command) -> ServeChild {
        use std::process::Stdio;
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn ctx serve");
        let stderr = collect_stderr(&mut child);
        let addr = listening_address(&mut child)
            .unwrap_or_else(|line| panic!("no address in {line:?}; stderr: {}", stderr.lock().unwrap()));
        ServeChild { child, addr, stderr }
    }
}

impl Drop for ServeChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
