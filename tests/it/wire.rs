//! The REST and MCP wire contract against a real server
//! on 127.0.0.1:0: the agents' flat body, every 405, `DELETE /mcp`, the Swagger UI without the
//! token, and an OpenAPI document whose operations match what the server does.

use std::process::Command;
use std::sync::Arc;

use ctx::server::{self, App, Security};
use ctx::tools::Tools;
use serde_json::{json, Value};

use crate::common::{repo, run_ok, test_python};
use crate::tools::{fixture, shipped};

const TOML: &str = r#"
[tools.script.echo]
path = "tools/echo.lua"

[tools.script.stamp]
path = "tools/stamp.lua"

[agents.inline.incident]
description = "Walks through an incident on one service."
system_prompt = "You handle the incident on {{service}}, severity {{severity}}."
arguments = [
  { name = "service", description = "The affected service", required = true },
  { name = "severity" },
]

[agents.inline.standup]
description = "Runs the daily standup."
system_prompt = "Run the standup."

[agents.inline.wrapper]
description = "Takes an argument that happens to be called arguments."
system_prompt = "Pass on: {{arguments}}."
arguments = [{ name = "arguments", required = true }]
"#;

/// A tool without required parameters: it may be called with no body at all.
const STAMP: &str = r#"
tool = {
    name = "stamp",
    description = "Stamps a label.",
    parameters = { { name = "label", type = "string", default = "none" } },
}
function tool.execute(params) return "stamped " .. params.label end
"#;

const TOKEN: &str = "wire-test-token-0123456789";

/// A real server over the fixture, and a client for it.
struct Wire {
    base: String,
    client: reqwest::Client,
    runtime: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

/// What a request got back.
struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Wire {
    fn start(token: Option<&str>) -> Wire {
        let (dir, registry) = fixture(TOML, &[("echo.lua", &shipped("echo.lua")), ("stamp.lua", STAMP)]).into_parts();
        assert!(registry.problems().is_empty(), "{:?}", registry.problems());
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let security = Security::new(addr, token.map(str::to_string), vec![]).unwrap();
        let app = Arc::new(App::new(Arc::new(Tools::new(registry)), security, 1 << 20));
        runtime.spawn(server::run(listener, app, std::future::pending()));
        let _ = rustls::crypto::ring::default_provider().install_default();
        Wire { base: format!("http://{addr}"), client: reqwest::Client::new(), runtime, _dir: dir }
    }

    fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        self.runtime.block_on(async {
            let response = request.send().await.expect("request");
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let text = response.text().await.unwrap();
            let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
            Reply { status, headers, body }
        })
    }

    fn request(&self, method: &str, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method.parse().unwrap(), format!("{}{path}", self.base))
    }

    fn post(&self, path: &str, body: Value) -> Reply {
        self.send(self.request("POST", path).json(&body))
    }

    fn openapi(&self) -> Value {
        let reply = self.send(self.request("GET", "/openapi.json"));
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.body
    }
}

fn message(reply: &Reply) -> &str {
    reply.body["error"]["message"].as_str().unwrap_or_else(|| panic!("no error message in {}", reply.body))
}

#[test]
fn agent_prompt_takes_the_flat_body() {
    let w = Wire::start(None);
    let resolved = w.post("/agents/incident/prompt", json!({"service": "payments", "severity": "sev2"}));
    assert_eq!(resolved.status, 200, "{}", resolved.body);
    assert_eq!(resolved.body["system"], "You handle the incident on payments, severity sev2.");

    // No body, or an empty one, when nothing is required.
    let bare = w.send(w.request("POST", "/agents/standup/prompt"));
    assert_eq!((bare.status, bare.body["system"].as_str()), (200, Some("Run the standup.")), "{}", bare.body);
    let empty = w.send(w.request("POST", "/agents/standup/prompt").header("content-type", "application/json").body(""));
    assert_eq!(empty.status, 200, "{}", empty.body);

    // A missing required argument is named where it belongs in the body that was sent.
    let missing = w.send(w.request("POST", "/agents/incident/prompt"));
    assert_eq!(missing.status, 400, "{}", missing.body);
    assert_eq!(missing.body["error"]["details"][0]["path"], "/service", "{}", missing.body);
    let unknown = w.post("/agents/incident/prompt", json!({"service": "a", "sevrity": "1"}));
    assert_eq!(unknown.body["error"]["details"][0]["path"], "/sevrity", "{}", unknown.body);

    // The old wrapped form is refused with the form to send instead.
    let wrapped = w.post("/agents/incident/prompt", json!({"arguments": {"service": "payments"}}));
    assert_eq!((wrapped.status, wrapped.body["error"]["code"].as_str()), (400, Some("bad_request")));
    assert!(message(&wrapped).contains(r#"send {"service":"payments"}, not {"arguments": "#), "{}", wrapped.body);
    // ...unless the agent declares an argument called `arguments`: then that is all it means.
    let declared = w.post("/agents/wrapper/prompt", json!({"arguments": "the logs"}));
    assert_eq!((declared.status, declared.body["system"].as_str()), (200, Some("Pass on: the logs.")));
    let nested = w.post("/agents/wrapper/prompt", json!({"arguments": {"a": "b"}}));
    assert_eq!(nested.status, 400, "{}", nested.body);
    assert_eq!(nested.body["error"]["details"][0]["path"], "/arguments");
    assert!(nested.body["error"]["details"][0]["message"].as_str().unwrap().contains("expected string"));

    let array = w.post("/agents/incident/prompt", json!(["payments"]));
    assert_eq!(array.status, 400);
    assert!(message(&array).contains(r#"for example {"service": "payments"}"#), "{}", array.body);

    // The contract in the schema and in the document.
    let doc = w.openapi();
    let generic = &doc["paths"]["/agents/{name}/prompt"]["post"];
    assert_eq!(
        generic["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/AgentPromptRequest"
    );
    assert_ne!(generic["requestBody"]["required"], true, "the body may be left out");
    let request = &doc["components"]["schemas"]["AgentPromptRequest"];
    assert_eq!(request["type"], "object");
    assert_eq!(request["additionalProperties"], json!({"type": "string"}));
    assert!(request.get("properties").is_none(), "no wrapping `arguments` field: {request}");
}

#[test]
fn every_405_names_the_right_method_and_sets_allow() {
    let w = Wire::start(None);
    let get = w.send(w.request("GET", "/agents/x/prompt"));
    assert_eq!(get.status, 405);
    assert_eq!(get.body["error"]["code"], "method_not_allowed");
    assert_eq!(message(&get), "GET is not allowed on /agents/x/prompt; use POST with a JSON body");
    assert_eq!(get.headers["allow"], "POST");

    // Every documented path, asked with each method it does not take.
    let doc = w.openapi();
    let mut checked = 0;
    for (template, item) in doc["paths"].as_object().unwrap() {
        let path = template.replace("{name}", "x");
        let declared: Vec<String> = ["get", "post", "put", "delete"]
            .iter()
            .filter(|m| item.get(**m).is_some())
            .map(|m| m.to_ascii_uppercase())
            .collect();
        for method in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
            if declared.iter().any(|d| d == method) {
                continue;
            }
            let reply = w.send(w.request(method, &path));
            assert_eq!(reply.status, 405, "{method} {path}: {}", reply.body);
            let allow = reply.headers["allow"].to_str().unwrap();
            let allowed: Vec<&str> = allow.split(',').map(str::trim).filter(|m| *m != "HEAD").collect();
            assert_eq!(allowed, declared, "{method} {path}: Allow {allow}");
            let hint = message(&reply).split("; use ").nth(1).unwrap_or_default();
            assert!(declared.iter().all(|d| hint.contains(d.as_str())), "{method} {path}: {}", message(&reply));
            checked += 1;
        }
    }
    assert!(checked > 30, "only {checked} wrong-method requests");
    // The routes outside the document: the Swagger UI pages and the MCP endpoint.
    let docs = w.send(w.request("POST", "/docs/"));
    assert_eq!((docs.status, message(&docs)), (405, "POST is not allowed on /docs/; use GET"));
    let mcp = w.send(w.request("PUT", "/mcp"));
    assert_eq!(mcp.status, 405, "{}", mcp.body);
    assert_eq!(mcp.headers["allow"], "GET, POST, DELETE");
    assert!(message(&mcp).contains("use POST for MCP messages"), "{}", mcp.body);
}

/// An MCP session of the 2025 era (with `Mcp-Session-Id`), opened by hand.
fn open_session(w: &Wire) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "wire-test", "version": "1"}}});
    let reply = w.send(w.request("POST", "/mcp").header("accept", "application/json, text/event-stream").json(&init));
    assert_eq!(reply.status, 200, "{}", reply.body);
    let session = reply.headers["mcp-session-id"].to_str().unwrap().to_string();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let reply = w.send(
        w.request("POST", "/mcp")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .json(&initialized),
    );
    assert_eq!(reply.status, 202, "{}", reply.body);
    session
}

#[test]
fn delete_mcp_ends_the_session_with_204() {
    let w = Wire::start(None);
    let session = open_session(&w);
    let delete = |session: &str| {
        w.send(
            w.request("DELETE", "/mcp").header("mcp-session-id", session).header("mcp-protocol-version", "2025-11-25"),
        )
    };
    let ended = delete(&session);
    assert_eq!(ended.status, 204, "the SDKs expect 200 or 204: {}", ended.body);
    assert_eq!(ended.body, Value::String(String::new()), "204 has no body");
    // The session is gone: using it again is refused.
    let again = w.send(
        w.request("POST", "/mcp")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})),
    );
    assert_eq!(again.status, 404, "{}", again.body);
}

/// The official Python SDK ends its session on exit and logs a warning unless the server
/// answers the DELETE with 200 or 204.
const PYTHON_SESSION: &str = r#"
import sys, anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

async def main(url):
    async with streamable_http_client(url) as (read, write, *_):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            print("tools:", len(tools.tools), flush=True)
    print("closed", flush=True)

anyio.run(main, sys.argv[1])
"#;

#[test]
fn python_sdk_ends_its_session_without_a_warning() {
    let Some(python) = test_python() else { return };
    let w = Wire::start(None);
    let output =
        Command::new(python).args(["-c", PYTHON_SESSION, &format!("{}/mcp", w.base)]).output().expect("run python");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("tools: 10") && stdout.contains("closed"), "{stdout}\n{stderr}");
    assert!(!stderr.contains("Session termination failed"), "the SDK logged a failed DELETE:\n{stderr}");
}

#[test]
fn swagger_ui_opens_without_the_token_and_every_call_needs_it() {
    let w = Wire::start(Some(TOKEN));
    // A browser (no Authorization header) opens the page and its assets...
    let page = w.send(w.request("GET", "/docs"));
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.headers["content-type"].to_str().unwrap().starts_with("text/html"));
    for asset in ["/docs/swagger-initializer.js", "/docs/swagger-ui-bundle.js", "/docs/swagger-ui.css"] {
        assert_eq!(w.send(w.request("GET", asset)).status, 200, "{asset}");
    }
    // ...and the document it loads: only what the repository publishes, nothing of this
    // server's tools and agents. The UI can show no Authorize button without a document.
    let public = w.send(w.request("GET", "/openapi.json"));
    assert_eq!(public.status, 200, "{}", public.body);
    let published: Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("openapi/openapi.json")).unwrap()).unwrap();
    assert!(public.body == published, "without the token: the checked-in document");
    let text = public.body.to_string();
    assert!(!text.contains("Stamps a label") && !text.contains("/agents/incident/prompt"), "{text}");
    // Every call still needs the token.
    for (method, path) in [("GET", "/tools/list"), ("POST", "/tools/stamp"), ("GET", "/agents/list")] {
        let reply = w.send(w.request(method, path));
        assert_eq!((reply.status, reply.body["error"]["code"].as_str()), (401, Some("unauthorized")), "{path}");
    }
    // With the token, the document has this server's tools and agents too.
    let full = w.send(w.request("GET", "/openapi.json").bearer_auth(TOKEN));
    assert_eq!(full.status, 200);
    assert!(
        full.body["paths"]["/tools/stamp"].is_object() && full.body["paths"]["/agents/incident/prompt"].is_object()
    );
    // The Authorize button comes from the bearer scheme, which every operation but /health uses.
    let scheme = &public.body["components"]["securitySchemes"]["bearer"];
    assert_eq!((scheme["type"].as_str(), scheme["scheme"].as_str()), (Some("http"), Some("bearer")));
    assert!(public.body["security"].as_array().unwrap().contains(&json!({"bearer": []})));
    assert_eq!(public.body["paths"]["/health"]["get"]["security"], json!([{}]));
    let call = w.send(w.request("POST", "/tools/stamp").bearer_auth(TOKEN));
    assert_eq!((call.status, &call.body["result"]), (200, &json!("stamped none")));
    // The Host check still covers the open routes.
    let foreign = w.send(w.request("GET", "/docs/").header("host", "attacker.example"));
    assert_eq!(foreign.status, 403);
}

/// The page answers at `/docs` and `/docs/` alike, with no redirect, and every asset it links
/// resolves (as a browser resolves it, `<base href>` first) to a file that is there.
#[test]
fn swagger_ui_loads_its_assets_at_docs_with_and_without_the_slash() {
    let w = Wire::start(None);
    let direct = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    for path in ["/docs", "/docs/"] {
        let page = w.send(direct.get(format!("{}{path}", w.base)));
        assert_eq!(page.status, 200, "{path}: {:?}", page.headers);
        assert!(page.headers["content-type"].to_str().unwrap().starts_with("text/html"), "{path}");
        let html = page.body.as_str().unwrap().to_string();
        let mut at = reqwest::Url::parse(&format!("{}{path}", w.base)).unwrap();
        if let Some(base) = html.split("<base href=\"").nth(1).and_then(|rest| rest.split('"').next()) {
            at = at.join(base).unwrap();
        }
        let links: Vec<&str> = ["href=\"", "src=\""]
            .iter()
            .flat_map(|attr| html.split(attr).skip(1).filter_map(|rest| rest.split('"').next()))
            .filter(|link| !link.starts_with('/') || link.starts_with("/docs/"))
            .collect();
        assert!(links.len() >= 4 && links.contains(&"./swagger-ui-bundle.js"), "{path}: {links:?}");
        for link in links {
            let url = at.join(link).unwrap();
            assert!(url.path().starts_with("/docs/"), "{path}: {link} resolves to {url}");
            let asset = w.send(direct.get(url.clone()));
            assert_eq!(asset.status, 200, "{path}: {link} ({url})");
        }
    }
}

#[test]
fn the_document_gives_swagger_ui_no_dialect_warning() {
    // Swagger UI 5 shows a red "OpenAPI.jsonSchemaDialect field contains a value different
    // from the default" box for any dialect but OpenAPI's own base dialect.
    let w = Wire::start(None);
    let served = w.openapi();
    let checked_in: Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("openapi/openapi.json")).unwrap()).unwrap();
    for doc in [&served, &checked_in] {
        match doc.get("jsonSchemaDialect") {
            None => {}
            Some(dialect) => assert_eq!(dialect, "https://spec.openapis.org/oas/3.1/dialect/base"),
        }
        assert!(!doc.to_string().contains("\"$schema\""), "no schema declares a dialect of its own");
    }
    // The UI is pointed at the document and at no outside validator.
    let init = w.send(w.request("GET", "/docs/swagger-initializer.js"));
    let init = init.body.as_str().unwrap();
    assert!(init.contains("\"/openapi.json\""), "{init}");
    assert!(init.contains("\"validatorUrl\": \"none\""), "{init}");
}

#[test]
fn each_agent_and_lua_tool_has_its_own_operation() {
    let w = Wire::start(None);
    let doc = w.openapi();
    let incident = &doc["paths"]["/agents/incident/prompt"]["post"];
    let body = &incident["requestBody"];
    assert_eq!(body["required"], true, "service is required");
    let schema = &body["content"]["application/json"]["schema"];
    assert_eq!(schema["required"], json!(["service"]));
    assert_eq!(schema["properties"]["service"], json!({"type": "string", "description": "The affected service"}));
    assert_eq!(schema["properties"]["severity"], json!({"type": "string"}));
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(incident["summary"], "Walks through an incident on one service.");
    assert_eq!(
        incident["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/AgentPrompt"
    );
    assert_eq!(doc["paths"]["/agents/standup/prompt"]["post"]["requestBody"]["required"], false);
    let echo = &doc["paths"]["/tools/echo"]["post"]["requestBody"];
    assert_eq!(echo["required"], true);
    assert_eq!(echo["content"]["application/json"]["schema"]["properties"]["repeat"]["default"], 1);
    assert_eq!(doc["paths"]["/tools/stamp"]["post"]["requestBody"]["required"], false);
    let ids: Vec<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .map(|op| op["operationId"].as_str().unwrap())
        .collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "operationIds are unique: {ids:?}");
}

/// `POST /tools/search` is both the built-in's own operation and the generic one with
/// `name = search`: the generic operation's 200 lists the built-ins' bodies beside `{result}`,
/// and each built-in's own operation keeps its one shape.
#[test]
fn the_generic_tool_call_documents_what_the_builtins_answer() {
    let w = Wire::start(None);
    let doc = w.openapi();
    let generic = &doc["paths"]["/tools/{name}"]["post"];
    let pattern = generic["parameters"][0]["schema"]["pattern"].as_str().unwrap();
    let regex = regress::Regex::new(pattern).unwrap();
    // Only `list` is excluded: its route takes GET only.
    assert!(regex.find("list").is_none(), "list is not a tool name");
    for name in ["search", "get", "sources", "echo", "stamp", "jira.create-issue"] {
        assert!(regex.find(name).is_some(), "{name}");
    }
    let ok_schema = |path: &str| {
        let item = &doc["paths"][path];
        let op = item.get("post").unwrap_or(&item["get"]);
        op["responses"]["200"]["content"]["application/json"]["schema"].clone()
    };
    let answer = ok_schema("/tools/{name}");
    let shapes: Vec<&str> = answer["oneOf"]
        .as_array()
        .map(|all| all.iter().map(|s| s["$ref"].as_str().unwrap()).collect())
        .unwrap_or_default();
    assert_eq!(
        shapes,
        ["ToolResult", "SearchResponse", "Document", "SourcesResponse"].map(|n| format!("#/components/schemas/{n}"))
    );
    // Each built-in's own operation describes its one body.
    assert_eq!(ok_schema("/tools/search")["$ref"], "#/components/schemas/SearchResponse");
    assert_eq!(ok_schema("/tools/get")["$ref"], "#/components/schemas/Document");
    assert_eq!(ok_schema("/tools/sources")["$ref"], "#/components/schemas/SourcesResponse");
    let found = w.post("/tools/search", json!({"query": "deploy"}));
    assert!(found.body["results"].is_array() && found.body.get("result").is_none(), "{}", found.body);
}

#[test]
fn request_body_required_matches_what_the_server_does() {
    let w = Wire::start(None);
    let doc = w.openapi();
    let mut optional = Vec::new();
    let mut required = Vec::new();
    for (template, item) in doc["paths"].as_object().unwrap() {
        let Some(op) = item.get("post") else { continue };
        // The generic operations, with a name no tool or agent has: not found, not a bad body.
        let path = template.replace("{name}", "no-such-name");
        let reply = w.send(w.request("POST", &path));
        if op["requestBody"]["required"] == true {
            assert_eq!(reply.status, 400, "POST {path} without its required body: {}", reply.body);
            required.push(path);
        } else {
            assert!(
                reply.status != 400 && reply.status != 415,
                "POST {path} without a body: {} {}",
                reply.status,
                reply.body
            );
            optional.push(path);
        }
    }
    for path in ["/tools/stamp", "/agents/standup/prompt", "/tools/sources", "/tools/no-such-name"] {
        assert!(optional.contains(&path.to_string()), "{path} in {optional:?}");
    }
    for path in ["/tools/echo", "/tools/search", "/tools/get", "/agents/incident/prompt"] {
        assert!(required.contains(&path.to_string()), "{path} in {required:?}");
    }
}

/// Every `$ref` in `value`.
fn refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(target)) = map.get("$ref") {
                out.push(target.clone());
            }
            map.values().for_each(|v| refs(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

#[test]
fn the_typed_document_keeps_the_schema_files_whole() {
    let w = Wire::start(None);
    let doc = w.openapi();
    // Every reference resolves to a component.
    let mut targets = Vec::new();
    refs(&doc, &mut targets);
    assert!(targets.len() > 50);
    for target in &targets {
        let name = target.strip_prefix("#/components/schemas/").unwrap_or_else(|| panic!("{target}"));
        assert!(doc["components"]["schemas"][name].is_object(), "{target} does not resolve");
    }
    // The components are the schema files' definitions, constraints included.
    let components = &doc["components"]["schemas"];
    assert_eq!(components.as_object().unwrap().len(), ctx::schema::definitions("#/").len());
    assert_eq!(components["GetRequest"]["properties"]["id"]["maxLength"], 64);
    assert!(components["ParamSpec"]["properties"]["name"]["pattern"].is_string());
    // Keywords utoipa's schema model lacks are kept too, and so is each file's key order.
    assert_eq!(components["TextContent"]["properties"]["type"]["const"], "text");
    assert_eq!(
        components["ToolResult"]["properties"]["result"],
        json!({"description": "The tool's return value (any JSON)."})
    );
    let defs = ctx::schema::definitions("#/components/schemas/");
    for (name, def) in &defs {
        assert_eq!(components[name].to_string(), def.to_string(), "{name}");
    }
    // Every documented operation is routed: none answers "no route".
    for (template, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let path = template.replace("{name}", "echo");
            let reply = w.send(w.request(&method.to_ascii_uppercase(), &path).json(&json!({"message": "m"})));
            let text = reply.body.to_string();
            assert!(!text.contains("no route"), "{method} {path}: {text}");
            assert_ne!(reply.status, 405, "{method} {path}");
        }
    }
}

#[test]
fn openapi_spec_validator_accepts_the_served_document_with_agents() {
    let Some(python) = test_python() else { return };
    let w = Wire::start(None);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("served.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&w.openapi()).unwrap()).unwrap();
    let out = run_ok(Command::new(python.with_file_name("openapi-spec-validator")).arg(&path));
    assert!(out.contains(": OK"), "{out}");
}
