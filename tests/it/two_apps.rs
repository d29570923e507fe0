//! Two applications in one process: each server has its own state (call log, metrics, rate
//! buckets, code-mode places, approval questions), so nothing one does shows through the other.

use std::sync::Arc;

use ctx::mcp::Mcp;
use ctx::server::{App, Security};
use ctx::tools::Tools;
use serde_json::{json, Value};

use crate::tools::{fixture, shipped};

/// One application: its workspace, its tools, and its server's address.
struct Served {
    _dir: tempfile::TempDir,
    tools: Arc<Tools>,
    base: String,
}

fn serve(runtime: &tokio::runtime::Runtime, tools_toml: &str) -> Served {
    let echo = shipped("echo.lua");
    let (dir, registry) = fixture(tools_toml, &[("echo.lua", echo.as_str())]).into_parts();
    let state = Arc::clone(registry.state());
    state.log.install(registry.kb().config(), state.db.as_ref()).unwrap();
    state.metrics.set_enabled(true);
    let tools = Arc::new(Tools::new(registry));
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let local = listener.local_addr().unwrap();
    let security = Security::new(local, None, vec![]).unwrap();
    let app = Arc::new(App::with_mcp(Mcp::new(Arc::clone(&tools)), security, 1 << 20));
    runtime.spawn(ctx::server::run(listener, app, std::future::pending()));
    Served { _dir: dir, tools, base: format!("http://{local}") }
}

impl Served {
    fn post(&self, runtime: &tokio::runtime::Runtime, path: &str, body: Value) -> (u16, Value) {
        let request = reqwest::Client::new().post(format!("{}{path}", self.base)).json(&body);
        runtime.block_on(async move {
            let response = request.send().await.unwrap();
            (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
        })
    }

    fn get(&self, runtime: &tokio::runtime::Runtime, path: &str) -> String {
        let request = reqwest::Client::new().get(format!("{}{path}", self.base));
        runtime.block_on(async move { request.send().await.unwrap().text().await.unwrap() })
    }

    /// The outcomes of the calls of `tool` in this application's call log, oldest first.
    fn logged(&self, runtime: &tokio::runtime::Runtime, tool: &str) -> Vec<String> {
        self.tools.current().state().log.flush();
        let page: Value = serde_json::from_str(&self.get(runtime, &format!("/calls?tool={tool}"))).unwrap();
        let mut outcomes: Vec<String> =
            page["calls"].as_array().unwrap().iter().map(|c| c["outcome"].as_str().unwrap().to_string()).collect();
        outcomes.reverse();
        outcomes
    }

    /// `ctx_tool_calls_total` of `tool` with `outcome` in this server's `/metrics` (0 when absent).
    fn counted(&self, runtime: &tokio::runtime::Runtime, tool: &str, outcome: &str) -> u64 {
        let text = self.get(runtime, "/metrics");
        let line = format!("ctx_tool_calls_total{{tool=\"{tool}\",outcome=\"{outcome}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&line)).map_or(0, |n| n.parse().unwrap())
    }
}

/// Both applications limit `echo` to the same rate with the same rule: in one process with
/// shared buckets, the second server's calls would be refused for the first one's.
const ECHO: &str = "[tools.script.echo]\npath = \"tools/echo.lua\"\nrate = \"2/hour\"\n";

#[test]
fn two_servers_in_one_process_keep_their_own_logs_metrics_and_rate_limits() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let a = serve(&runtime, ECHO);
    let b = serve(&runtime, ECHO);
    let call = |s: &Served| s.post(&runtime, "/tools/echo", json!({"message": "hi"})).0;

    assert_eq!([call(&a), call(&a), call(&a)], [200, 200, 429], "the first server's rate");
    assert_eq!([call(&b), call(&b)], [200, 200], "the second server's calls draw on buckets of its own");

    assert_eq!(a.logged(&runtime, "echo"), ["ok", "ok", "rate_limited"], "the first server's call log");
    assert_eq!(b.logged(&runtime, "echo"), ["ok", "ok"], "the second server's call log");
    let counts = |s: &Served| (s.counted(&runtime, "echo", "ok"), s.counted(&runtime, "echo", "rate_limited"));
    assert_eq!(counts(&a), (2, 1), "the first server's metrics");
    assert_eq!(counts(&b), (2, 0), "the second server's metrics");

    // Turning one application's metrics off leaves the other's counting.
    a.tools.current().state().metrics.set_enabled(false);
    assert_eq!([call(&a), call(&b)], [429, 429]);
    assert_eq!(counts(&a), (2, 1), "counting is off in the first");
    assert_eq!(counts(&b), (2, 1), "and on in the second");
}
