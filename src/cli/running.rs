//! The `ctx serve` already running for this config, for the commands that would otherwise start
//! every upstream server themselves (`ctx run`, `ctx catalog`, `ctx mcp list`): its upstreams are
//! connected, so asking it costs one request instead of seconds of process starts.

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

impl Running {
    /// The server at `config`'s `server.bind`, when one answers with this config's file name
    /// (a ctx serving another workspace on the same port is not asked). `None` also when its
    /// token is needed and not set in this shell.
    pub async fn find(config: &Config) -> Option<Running> {
        let (addr, security) = crate::server::settings(config).ok()?;
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
    /// server cannot be asked (gone, or the token is refused): the command then works alone.
    pub async fn call(&self, tool: &str, params: &Json) -> Option<(u16, Json)> {
        let mut request = self.client.post(format!("{}/tools/{tool}", self.base)).json(params);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.ok()?;
        let status = response.status().as_u16();
        if status == 401 || status == 403 {
            return None;
        }
        Some((status, response.json().await.ok()?))
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
