//! On a real `ctx serve`: scoped tokens over REST, MCP, OpenAPI and the inner calls of
//! code mode; rate limits with 429 and `Retry-After`.

use std::process::Command;

use serde_json::{json, Value};

use crate::common::{repo, ServeChild, Workspace, BIN};

pub const ADMIN: &str = "admin-token-0123456789";
pub const CI: &str = "ci-token-0123456789abc";
pub const READER: &str = "reader-token-0123456789";

/// A served workspace with the sample docs, the echo tool and three tokens.
pub struct Server {
    pub ws: Workspace,
    pub serve: ServeChild,
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
}

/// The `ctx` command of a workspace, with the tokens' variables set.
pub fn ctx_in(ws: &Workspace, args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .current_dir(ws.path())
        .args(args)
        .env("ADMIN_TOKEN", ADMIN)
        .env("CI_TOKEN", CI)
        .env("READER_TOKEN", READER)
        .env("CTX_MODEL_DIR", "/nonexistent")
        .env_remove("CTX_LOG");
    command
}

pub fn serve(extra: &str) -> Server {
    serve_with(extra, &[])
}

/// [`serve`] with more files in the workspace, written before the server starts.
pub fn serve_with(extra: &str, files: &[(&str, &str)]) -> Server {
    let ws = Workspace::new(&format!(
        "[server]\nauth_token = \"${{ADMIN_TOKEN}}\"\n\n\
         [[server.tokens]]\nname = \"ci\"\ntoken = \"${{CI_TOKEN}}\"\ntools = [\"search\", \"echo\", \"execute\", \"*_tool*\"]\n\n\
         [[server.tokens]]\nname = \"reader\"\ntoken = \"${{READER_TOKEN}}\"\ntools = [\"get\"]\n\n\
         [connectors.filesystem.docs]\nroot = \"docs\"\n\n\
         [tools.script.echo]\npath = \"echo.lua\"\n{extra}"
    ));
    ws.write("docs/deploy.md", "# Deploy\n\nThe deploy runbook.\n");
    std::fs::copy(repo().join("tools/echo.lua"), ws.path().join("echo.lua")).unwrap();
    for (path, text) in files {
        ws.write(path, text);
    }
    let ctx = |args: &[&str]| ctx_in(&ws, args);
    let synced = ctx(&["sync"]).output().unwrap();
    assert!(synced.status.success(), "{}", String::from_utf8_lossy(&synced.stderr));
    let serve = ServeChild::spawn(&mut ctx(&["serve", "--bind", "127.0.0.1:0", "-v"]));
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    Server { ws, serve, runtime, client: reqwest::Client::new() }
}

impl Server {
    /// Runs `ctx` in the served workspace, as a person beside the server would.
    pub fn cli(&self, args: &[&str]) -> crate::common::Run {
        crate::common::Run(ctx_in(&self.ws, args).output().unwrap())
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.serve.addr)
    }

    /// A REST request with extra headers: status, body, and the `Retry-After` header.
    pub fn send_with(
        &self,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Value,
    ) -> (u16, Value, Option<String>) {
        self.runtime.block_on(async {
            let mut request = self.client.post(self.url(path)).json(&body);
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            for (k, v) in headers {
                request = request.header(*k, *v);
            }
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let retry = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
            (status, response.json().await.unwrap_or(Value::Null), retry)
        })
    }

    /// A GET whose body is text (`/metrics`).
    pub fn get_text(&self, path: &str, token: Option<&str>) -> String {
        let url = format!("http://{}{path}", self.serve.addr);
        self.runtime.block_on(async {
            let mut request = self.client.get(url);
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            request.send().await.unwrap().text().await.unwrap()
        })
    }

    pub fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value, Option<String>) {
        let url = format!("http://{}{path}", self.serve.addr);
        self.runtime.block_on(async {
            let mut request = match method {
                "GET" => self.client.get(url),
                _ => self.client.post(url),
            };
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            if let Some(body) = body {
                request = request.json(&body);
            }
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let retry = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
            (status, response.json().await.unwrap_or(Value::Null), retry)
        })
    }

    pub fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        let (status, body, _) = self.send("GET", path, token, None);
        (status, body)
    }

    pub fn post(&self, path: &str, token: Option<&str>, body: Value) -> (u16, Value) {
        let (status, body, _) = self.send("POST", path, token, Some(body));
        (status, body)
    }

    /// A stateless (2026-07-28) MCP request.
    pub fn mcp(&self, token: &str, method: &str, name: Option<&str>, params: Value) -> Value {
        let mut params = params;
        params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}});
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let url = format!("http://{}/mcp", self.serve.addr);
        self.runtime.block_on(async {
            let mut request = self
                .client
                .post(url)
                .bearer_auth(token)
                .header("accept", "application/json, text/event-stream")
                .header("content-type", "application/json")
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", method);
            if let Some(name) = name {
                request = request.header("mcp-name", name);
            }
            let response = request.body(body.to_string()).send().await.unwrap();
            let text = response.text().await.unwrap();
            serde_json::from_str(&text).unwrap_or_else(|_| {
                // An SSE answer: its data line.
                let data = text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or("null");
                serde_json::from_str(data).unwrap()
            })
        })
    }
}

fn names(listing: &Value) -> Vec<String> {
    listing["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_string()).collect()
}

#[test]
fn each_token_sees_and_calls_only_its_tools_on_rest_mcp_openapi_and_inner_calls() {
    let s = serve("");
    // Unknown or missing tokens are 401.
    assert_eq!(s.get("/tools/list", None).0, 401);
    assert_eq!(s.get("/tools/list", Some("wrong-token-0123456789")).0, 401);

    // The listing: auth_token sees everything, each named token its globs.
    let (status, all) = s.get("/tools/list", Some(ADMIN));
    assert_eq!(status, 200);
    assert!(names(&all).contains(&"get".to_string()) && names(&all).contains(&"echo".to_string()));
    let (_, ci) = s.get("/tools/list", Some(CI));
    let mut ci_names = names(&ci);
    ci_names.sort();
    assert_eq!(ci_names, ["describe_tool", "echo", "execute", "list_tools", "search", "search_tools"]);
    // execute's description lists the catalog: the token's tools only.
    let execute = ci["tools"].as_array().unwrap().iter().find(|t| t["name"] == "execute").unwrap();
    let described = execute["description"].as_str().unwrap();
    assert!(described.contains("Servers (2 tools): ctx (2)."), "search and echo: {described}");
    let (_, all_execute) = s.get("/tools/list", Some(ADMIN));
    let full = all_execute["tools"].as_array().unwrap().iter().find(|t| t["name"] == "execute").unwrap();
    assert!(full["description"].as_str().unwrap().contains("Servers (4 tools): ctx (4)."), "{full}");
    assert_eq!(names(&s.get("/tools/list", Some(READER)).1), ["get"]);

    // Calls: in scope works, out of scope is 404 as if the tool did not exist.
    assert_eq!(s.post("/tools/search", Some(CI), json!({"query": "deploy"})).0, 200);
    let (status, body) = s.post("/tools/get", Some(CI), json!({"id": "x"}));
    assert_eq!(status, 404, "{body}");
    let text = body.to_string();
    assert!(text.contains("unknown tool 'get'"), "{text}");
    assert!(!text.contains("sources"), "no hint of other tools: {text}");
    let (status, _) = s.post("/tools/echo", Some(READER), json!({"message": "m"}));
    assert_eq!(status, 404);
    assert_eq!(s.post("/tools/echo", Some(ADMIN), json!({"message": "m"})).0, 200);

    // OpenAPI: only the operations of the token's tools.
    let (_, doc) = s.get("/openapi.json", Some(CI));
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.contains_key("/tools/search") && paths.contains_key("/tools/echo"));
    assert!(!paths.contains_key("/tools/get") && !paths.contains_key("/tools/sources"), "{:?}", paths.keys());
    let (_, doc) = s.get("/openapi.json", Some(READER));
    assert!(!doc["paths"].as_object().unwrap().contains_key("/tools/echo"));

    // MCP: the listing and the calls.
    let listed = s.mcp(CI, "tools/list", None, json!({}));
    let mut mcp_names: Vec<String> =
        listed["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_string()).collect();
    mcp_names.sort();
    assert_eq!(mcp_names, ["describe_tool", "echo", "execute", "list_tools", "search", "search_tools"], "{listed}");
    // Discovery inside code mode: only the token's tools.
    let (status, found) = s.post("/tools/search_tools", Some(CI), json!({"query": "document sources get"}));
    assert_eq!(status, 200, "{found}");
    assert!(!found.to_string().contains("\"sources\""), "{found}");
    let (status, described) = s.post("/tools/describe_tool", Some(CI), json!({"name": "get"}));
    assert_eq!(status, 404, "{described}");
    let called = s.mcp(CI, "tools/call", Some("search"), json!({"name": "search", "arguments": {"query": "deploy"}}));
    assert!(called["result"]["structuredContent"]["results"].is_array(), "{called}");
    let refused = s.mcp(READER, "tools/call", Some("echo"), json!({"name": "echo", "arguments": {"message": "m"}}));
    assert!(refused.to_string().contains("unknown tool 'echo'"), "{refused}");

    // Code mode: the script runs for the token, so `get` is unknown to it too.
    let (status, out) = s.post(
        "/tools/execute",
        Some(CI),
        json!({"script": "local ok, e = pcall(function() return ctx.get({id = 'x'}):await() end)\n\
                          return {ok = ok, hits = #ctx.search({query = 'deploy'}):await().results, err = tostring(e)}"}),
    );
    assert_eq!(status, 200, "{out}");
    let result = &out["result"];
    assert_eq!(result["ok"], false, "{out}");
    // The script's globals are built from the token's tools: `ctx.get` does not exist there.
    assert!(result["err"].as_str().unwrap().contains("ctx has no tool \"get\""), "{out}");
    assert_eq!(result["hits"], 1, "{out}");
    // Its globals and in-script discovery know only the token's tools.
    let (status, out) = s.post(
        "/tools/execute",
        Some(CI),
        json!({"script": "local found = pcall(describe_tool, 'get')\n\
                          local servers = list_servers()\n\
                          return {found = found, tools = servers.servers[1].tools}"}),
    );
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["result"], json!({"found": false, "tools": 2}), "{out}");

    // No token ever reaches the log.
    let log = s.serve.stderr.lock().unwrap().clone();
    for token in [ADMIN, CI, READER] {
        assert!(!log.contains(token), "a token in the log");
    }
}

#[test]
fn tokens_are_checked_at_startup() {
    let ws = Workspace::new(
        "[[server.tokens]]\nname = \"a\"\ntoken = \"same-token-0123456789\"\n\n\
         [[server.tokens]]\nname = \"b\"\ntoken = \"same-token-0123456789\"\n",
    );
    let run = ws.ctx(&["serve", "--bind", "127.0.0.1:0"]);
    assert_ne!(run.code(), 0);
    assert!(run.stderr().contains("\"a\" and \"b\" have the same token"), "{}", run.stderr());
    assert!(!run.stderr().contains("same-token-0123456789"), "the token itself is not printed: {}", run.stderr());
    let ws = Workspace::new("[[server.tokens]]\nname = \"a\"\ntoken = \"a-token-0123456789\"\ntools = [\"[\"]\n");
    let run = ws.ctx(&["serve", "--bind", "127.0.0.1:0"]);
    assert!(run.stderr().contains("not a valid glob"), "{}", run.stderr());
}
