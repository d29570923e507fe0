//! The `ctx serve` already running for this config, for the commands that would otherwise start
//! every upstream server themselves (`ctx run`, `ctx catalog`, `ctx mcp list`): its upstreams are
//! connected, so asking it costs one request instead of seconds of process starts.
//!
//! A serving `ctx serve` leaves a marker in its workspace's data folder (`serve.json`: its pid
//! and address). A command asks only the server its own workspace's marker names, while that
//! process lives: never another workspace's server on the same port, and never whatever listens
//! on `server.bind` while ctx is down (which would be handed the token and the script).

use std::time::Duration;

use serde_json::{json, Value as Json};

use crate::config::Config;

/// How long a command waits for a running server to answer `/health` before it works alone.
const PROBE: Duration = Duration::from_secs(2);

/// A server that answered `/health` at `server.bind`, serving a config file of the same name.
pub struct Running {
    client: reqwest::Client,
    base: String,
    token: Option<String>,
    /// Its `/health` answer.
    pub health: Json,
}

/// The folder of `config`'s marker: its database's.
pub fn marker_dir(config: &Config) -> std::path::PathBuf {
    config.db_path().parent().map(std::path::Path::to_path_buf).unwrap_or_default()
}

/// The marker of a serving `ctx serve`, removed when it stops (a `kill -9` leaves it, and the
/// pid in it then names no process, or not this one for long).
pub struct Marker(std::path::PathBuf);

impl Marker {
    pub fn write(dir: &std::path::Path, addr: std::net::SocketAddr) -> Option<Marker> {
        let path = dir.join("serve.json");
        let body = json!({"pid": std::process::id(), "addr": addr.to_string()});
        std::fs::write(&path, body.to_string()).ok()?;
        Some(Marker(path))
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The address in this workspace's marker, when the process that wrote it still runs.
fn marked_address(config: &Config) -> Option<String> {
    let text = std::fs::read_to_string(marker_dir(config).join("serve.json")).ok()?;
    let marker: Json = serde_json::from_str(&text).ok()?;
    let pid = i32::try_from(marker.get("pid")?.as_u64()?).ok()?;
    // SAFETY: signal 0 only asks whether the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0 && pid != std::process::id() as i32;
    alive.then(|| marker.get("addr").and_then(Json::as_str).map(str::to_string)).flatten()
}

impl Running {
    /// The server this workspace's marker names, when it answers with this config's file name.
    /// `None` also when its token is needed and not set in this shell.
    pub async fn find(config: &Config) -> Option<Running> {
        let addr = marked_address(config)?;
        let (_, security) = crate::server::settings(config).ok()?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder().connect_timeout(PROBE).no_proxy().build().ok()?;
        let base = format!("http://{addr}");
        let token = security.token.clone();
        let mut probe = client.get(format!("{base}/health")).timeout(PROBE);
        if let Some(token) = &token {
            probe = probe.bearer_auth(token);
        }
        let health: Json = probe.send().await.ok()?.json().await.ok()?;
        // An older ctx has no version; another workspace's server serves another file.
        health.get("version")?;
        let file = config.file.file_name().map(|f| f.to_string_lossy().into_owned());
        if health.pointer("/config/file").and_then(Json::as_str) != file.as_deref() {
            return None;
        }
        Some(Running { client, base, token, health })
    }

    pub fn address(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// `POST /tools/{tool}` with `params`: the HTTP status and the JSON body. `None` when the
    /// server could not be asked (no connection, or the token is refused): the command then
    /// works alone. `Some(Err)` when the request went out and its answer was lost: the call may
    /// have run there, so it must not run again here.
    pub async fn call(&self, tool: &str, params: &Json) -> Option<Result<(u16, Json), String>> {
        let mut request = self.client.post(format!("{}/tools/{tool}", self.base)).json(params);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) if e.is_connect() => return None,
            Err(e) => return Some(Err(lost(&self.base, &e))),
        };
        let status = response.status().as_u16();
        if status == 401 || status == 403 {
            return None;
        }
        Some(response.json().await.map(|body| (status, body)).map_err(|e| lost(&self.base, &e)))
    }

    /// One stateless (2026-07-28) MCP request: its `result`, or `None` when it failed.
    pub async fn mcp(&self, method: &str, params: Json) -> Option<Json> {
        let mut params = params;
        params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}});
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let mut request = self
            .client
            .post(format!("{}/mcp", self.base))
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", method)
            .json(&body);
        if let Some(name) = params.get("name").and_then(Json::as_str) {
            request = request.header("mcp-name", name);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let answer: Json = request.send().await.ok()?.json().await.ok()?;
        answer.get("result").cloned()
    }
}

fn lost(base: &str, e: &reqwest::Error) -> String {
    format!(
        "the ctx serve at {base} took the script but its answer was lost ({e}); it may have run there: see `ctx log`, and run it again if it did not"
    )
}
