//! Egress and secrets: redirects checked hop by hop (item 3), private addresses refused
//! by default, `env.get` kept from ctx's own secrets (15c), and secrets redacted from errors,
//! logs, `/health` and config errors (items 11 and 12).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ctx::config::{Config, ScriptKind};
use ctx::lua::{CancelHandle, Limits, ScriptError, ScriptInfo, Vm};
use serde_json::{json, Value};

use crate::common::{Workspace, BIN};

// ---- a stub that can redirect ----

#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    headers: BTreeMap<String, String>,
    body: String,
}

type Reply = (u16, Vec<(String, String)>, String);

/// A local HTTP server answering `reply(request)`, recording every request.
struct Stub {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Stub {
    fn start(reply: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Stub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Default::default();
        let (log, reply) = (Arc::clone(&seen), Arc::new(reply));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (log, reply) = (Arc::clone(&log), Arc::clone(&reply));
                std::thread::spawn(move || serve_one(stream, &log, &*reply));
            }
        });
        Stub { addr, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve_one(mut stream: TcpStream, log: &Mutex<Vec<Seen>>, reply: &dyn Fn(&Seen) -> Reply) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut first = String::new();
    if reader.read_line(&mut first).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = first.split_whitespace();
    let (method, path) = (parts.next().unwrap_or_default().to_string(), parts.next().unwrap_or_default().to_string());
    let mut headers = BTreeMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let len: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0u8; len];
    let _ = reader.read_exact(&mut body);
    let seen = Seen { method, path, headers, body: String::from_utf8_lossy(&body).into_owned() };
    let (status, extra, text) = reply(&seen);
    log.lock().unwrap().push(seen);
    let mut head =
        format!("HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n", text.len());
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    let _ = write!(stream, "{head}Connection: close\r\n\r\n{text}");
}

fn location(to: String) -> Vec<(String, String)> {
    vec![("Location".to_string(), to)]
}

// ---- running a script in the sandbox ----

/// Runs `body` as `tool.execute()` of a tool `probe` whose section `edit` shapes.
fn run(edit: impl Fn(&mut ScriptInfo), body: &str) -> Result<Value, ScriptError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools/probe.lua");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, format!("tool = {{}}\nfunction tool.execute()\n{body}\nend\n")).unwrap();
    let mut info = ScriptInfo::from_path(ScriptKind::Tool, &path);
    info.name = "probe".into();
    info.display_path = "tools/probe.lua".into();
    edit(&mut info);
    run_info(info)
}

fn run_info(info: ScriptInfo) -> Result<Value, ScriptError> {
    let limits =
        Limits { timeout: Duration::from_secs(10), memory_bytes: 16 * 1024 * 1024, max_result_bytes: 64 * 1024 };
    let vm = Vm::new(info, limits, CancelHandle::new())?;
    let ext = vm.load_extension("tool")?;
    let execute = vm.function(&ext, "tool", "execute")?;
    let result = vm.call(&execute, ())?;
    vm.result_json(&result)
}

#[track_caller]
fn error_of(result: Result<Value, ScriptError>) -> String {
    match result {
        Err(ScriptError::Runtime { message, .. }) => message,
        other => panic!("expected a runtime error, got {other:?}"),
    }
}

fn hosts(list: &[&str]) -> Option<Vec<String>> {
    Some(list.iter().map(|s| s.to_string()).collect())
}

// ---- item 3: redirects ----

#[test]
fn redirects_are_checked_and_drop_script_headers() {
    let internal = Stub::start(|_| (200, vec![], r#"{"inside":true}"#.into()));
    let inside = internal.addr.port();
    let front = Stub::start(move |r| match r.path.as_str() {
        "/start" => (302, location(format!("http://127.0.0.1:{inside}/internal")), String::new()),
        "/same" | "/post302" => (302, location("/final".into()), String::new()),
        "/post307" => (307, location("/final".into()), String::new()),
        "/loop" => (302, location("/loop".into()), String::new()),
        _ => (200, vec![], json!({"path": r.path}).to_string()),
    });
    let port = front.addr.port();
    let get = |path: &str| {
        format!("return http.get('http://localhost:{port}{path}', {{ headers = {{ ['X-Api-Key'] = 'k-s3cr3t-key' }} }}).status")
    };

    // The reproduction: allow_hosts = ["localhost"], a 302 to 127.0.0.1 is refused.
    let only_localhost = |info: &mut ScriptInfo| info.allow_hosts = hosts(&["localhost"]);
    let message = error_of(run(only_localhost, &get("/start")));
    assert!(
        message.contains(r#"a redirect from "localhost" was refused: host "127.0.0.1" is not in this script's allow_hosts (localhost)"#),
        "{message}"
    );
    assert!(message.contains("[tools.script.probe]"), "says where to allow it: {message}");
    assert!(internal.seen().is_empty(), "the refused hop was never requested");
    assert_eq!(front.seen()[0].headers["x-api-key"], "k-s3cr3t-key");

    // Allowed on both hosts, the redirect is followed, but the script's header stays behind.
    let both = |info: &mut ScriptInfo| info.allow_hosts = hosts(&["localhost", "127.0.0.1"]);
    assert_eq!(run(both, &get("/start")).unwrap(), json!(200));
    let reached = internal.seen();
    assert_eq!(reached.len(), 1);
    assert_eq!(reached[0].path, "/internal");
    assert!(!reached[0].headers.contains_key("x-api-key"), "{:?}", reached[0].headers);

    // On the same origin the headers go along.
    assert_eq!(run(only_localhost, &get("/same")).unwrap(), json!(200));
    let last = front.seen().last().cloned().unwrap();
    assert_eq!(
        (last.path.as_str(), last.headers.get("x-api-key").map(String::as_str)),
        ("/final", Some("k-s3cr3t-key"))
    );

    // 307 repeats the POST with its body; 302 turns it into a GET without one.
    let post = |path: &str| format!("return http.post('http://localhost:{port}{path}', 'payload').status");
    assert_eq!(run(only_localhost, &post("/post307")).unwrap(), json!(200));
    let last = front.seen().last().cloned().unwrap();
    assert_eq!((last.method.as_str(), last.path.as_str(), last.body.as_str()), ("POST", "/final", "payload"));
    assert_eq!(run(only_localhost, &post("/post302")).unwrap(), json!(200));
    let last = front.seen().last().cloned().unwrap();
    assert_eq!((last.method.as_str(), last.path.as_str(), last.body.as_str()), ("GET", "/final", ""));

    // A redirect loop ends after the limit.
    let before = front.seen().len();
    let message = error_of(run(only_localhost, &get("/loop")));
    assert!(message.contains("more than 10 redirects"), "{message}");
    assert_eq!(front.seen().len() - before, 11, "the first request and 10 redirects");
}

// ---- private addresses ----

#[test]
fn hardening_egress_private_addresses_are_refused_by_default() {
    let stub = Stub::start(|_| (200, vec![], "{}".into()));
    let port = stub.addr.port();
    let get = |url: String| format!("return http.get('{url}').status");
    let default = |_: &mut ScriptInfo| {};
    for (url, needle) in [
        (format!("http://127.0.0.1:{port}/"), "127.0.0.1 is a loopback address"),
        (format!("http://localhost:{port}/"), "host \"localhost\" resolves to"),
        (format!("http://[::ffff:127.0.0.1]:{port}/"), "is a loopback address"),
        (format!("http://2130706433:{port}/"), "127.0.0.1 is a loopback address"),
        (format!("http://0.0.0.0:{port}/"), "0.0.0.0 is an unspecified address"),
        ("http://169.254.169.254/latest/meta-data/".to_string(), "169.254.169.254 is a link-local address"),
        ("http://10.1.2.3/".to_string(), "10.1.2.3 is a private address"),
        ("http://[fd00::1]/".to_string(), "fd00::1 is a private address"),
        ("http://100.64.0.1/".to_string(), "carrier-grade NAT"),
    ] {
        let message = error_of(run(default, &get(url.clone())));
        assert!(message.contains(needle), "{url}: {message}");
        assert!(
            message.contains("add") && message.contains("allow_private = true, in [tools.script.probe] of ctx.toml"),
            "says which setting allows it: {message}"
        );
    }
    assert!(stub.seen().is_empty(), "nothing reached the stub");

    // The operator's switches: an exact allow_hosts name, a CIDR range, allow_private.
    let named = |info: &mut ScriptInfo| info.allow_hosts = hosts(&["localhost"]);
    assert_eq!(run(named, &get(format!("http://localhost:{port}/"))).unwrap(), json!(200));
    let range = |info: &mut ScriptInfo| info.allow_hosts = hosts(&["127.0.0.0/8"]);
    assert_eq!(run(range, &get(format!("http://127.0.0.1:{port}/"))).unwrap(), json!(200));
    let private = |info: &mut ScriptInfo| info.allow_private = true;
    assert_eq!(run(private, &get(format!("http://127.0.0.1:{port}/"))).unwrap(), json!(200));
    assert_eq!(stub.seen().len(), 3);

    // The config carries the switch and checks CIDR ranges.
    let config =
        load("[tools.script.t]\npath = \"t.lua\"\nallow_private = true\nallow_hosts = [\"10.0.0.0/8\"]\n", &[])
            .unwrap();
    assert!(config.scripts[0].allow_private);
    let err = load("[tools.script.t]\npath = \"t.lua\"\nallow_hosts = [\"10.0.0.0/40\"]\n", &[]).unwrap_err();
    assert!(
        err.to_string().contains("tools.script.t.allow_hosts.0 (line 3): \"10.0.0.0/40\" is not a CIDR range"),
        "{err}"
    );
}

fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ctx::config::ConfigError> {
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let lookup = move |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    Config::from_text(text, Path::new("ctx.toml"), Path::new("/w/ctx.toml"), &lookup)
}

// ---- item 15c: env.get ----

#[test]
fn hardening_15c_env_get_never_reads_ctx_secrets() {
    std::env::set_var("CTX_HE15_TOKEN", "server-token-0123456789");
    std::env::set_var("CTX_HE15_OTHER", "other-tool-secret");
    std::env::set_var("CTX_HE15_OWN", "own-value");
    let text = r#"
[server]
auth_token = "${CTX_HE15_TOKEN}"

[tools.script.other]
path = "tools/other.lua"
key = "${CTX_HE15_OTHER}"

[tools.script.probe]
path = "tools/probe.lua"
own = "${CTX_HE15_OWN}"
allow_env = ["CTX_HE15_TOKEN", "CTX_HE15_OTHER", "CTX_HE15_OWN"]

[tools.script.quiet]
path = "tools/quiet.lua"
"#;
    let config =
        Config::from_text(text, Path::new("ctx.toml"), Path::new("/w/ctx.toml"), &|n| std::env::var(n).ok()).unwrap();
    let section = |name: &str| config.scripts.iter().find(|s| s.name == name).unwrap().clone();
    let dir = tempfile::tempdir().unwrap();
    let script = |name: &str, body: &str| {
        let mut section = section(name);
        section.path = dir.path().join(format!("tools/{name}.lua"));
        std::fs::create_dir_all(section.path.parent().unwrap()).unwrap();
        std::fs::write(&section.path, format!("tool = {{}}\nfunction tool.execute()\n{body}\nend\n")).unwrap();
        run_info(ScriptInfo::from_section(&section))
    };

    // The server's token and another section's variable stay closed, whatever allow_env says.
    let message = error_of(script("probe", "return env.get('CTX_HE15_TOKEN')"));
    assert!(
        message.contains("CTX_HE15_TOKEN holds a secret ctx itself uses (server.auth_token in ctx.toml)"),
        "{message}"
    );
    assert!(!message.contains("server-token-0123456789"), "{message}");
    let message = error_of(script("probe", "return env.get('CTX_HE15_OTHER')"));
    assert!(message.contains("(tools.script.other.key in ctx.toml)"), "{message}");
    // Its own section's variable, listed in allow_env, reads.
    assert_eq!(script("probe", "return env.get('CTX_HE15_OWN')").unwrap(), json!("own-value"));
    // Without allow_env, nothing reads, and the message says how to allow it.
    let message = error_of(script("quiet", "return env.get('HOME')"));
    assert!(
        message.contains("tool 'quiet' may not read environment variables")
            && message.contains("[tools.script.quiet] of ctx.toml, for example allow_env = [\"HOME\"]"),
        "{message}"
    );
}

// ---- items 11 and 12: redaction, through the real binary ----

const API_KEY: &str = "sk-live-REDACTME-4f9a2c";
const BOOT_KEY: &str = "boot-REDACTME-77aa11";
const TOKEN: &str = "server-REDACTME-token-0001";

const LEAKY: &str = r#"
tool = {
    name = "leaky",
    description = "Builds a URL with its key, and fails in the ways a careless tool does.",
    parameters = {
        { name = "url", type = "string", required = true, description = "Base URL" },
        { name = "mode", type = "string", default = "url", description = "How to fail" },
    },
}
function tool.execute(params, context)
    local key = context.config.api_key
    log.warn("calling with key " .. key)
    if params.mode == "raise" then error("upstream rejected key " .. key) end
    if params.mode == "mcp" then return MCP.error("bad_key_" .. key, "rejected " .. key, { key = key }) end
    return http.get(params.url .. "?key=" .. key)
end
"#;

const BROKEN: &str = r#"
error("cannot start with key " .. env.get("CTX_HE_BOOT"))
"#;

/// `ctx serve` on a free port, with its stderr collected.
fn serve(ws: &Workspace) -> crate::common::ServeChild {
    crate::common::ServeChild::spawn(
        Command::new(BIN)
            .current_dir(ws.path())
            .args(["--config", "ctx.toml", "-v", "serve", "--bind", "127.0.0.1:0"])
            .env_remove("CTX_CONFIG")
            .env_remove("CTX_LOG")
            .env("CTX_HE_API_KEY", API_KEY)
            .env("CTX_HE_BOOT", BOOT_KEY)
            .env("CTX_HE_TOKEN", TOKEN),
    )
}

/// One HTTP/1.1 request with the bearer token; the status and the body.
fn request(addr: &str, method: &str, path: &str, body: Option<Value>) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

#[track_caller]
fn assert_clean(what: &str, text: &str) {
    for secret in [API_KEY, BOOT_KEY, TOKEN] {
        assert!(!text.contains(secret), "{what} shows a secret:\n{text}");
    }
}

#[test]
fn secrets_never_leave_in_errors_logs_or_health() {
    let ws = Workspace::new(
        r#"
[server]
auth_token = "${CTX_HE_TOKEN}"

[tools.script.leaky]
path = "tools/leaky.lua"
api_key = "${CTX_HE_API_KEY}"

[tools.script.broken]
path = "tools/broken.lua"
boot_key = "${CTX_HE_BOOT}"
allow_env = ["CTX_HE_BOOT"]
"#,
    );
    ws.write("tools/leaky.lua", LEAKY);
    ws.write("tools/broken.lua", BROKEN);
    let served = serve(&ws);

    // The reproduction of item 11: a bad URL echoed the key.
    let (status, body) = request(&served.addr, "POST", "/tools/leaky", Some(json!({"url": "http://[::1"})));
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("invalid URL") && body.contains("[redacted ${CTX_HE_API_KEY}]"), "{body}");
    assert_clean("the invalid-URL error", &body);
    for mode in ["raise", "mcp"] {
        let (status, body) = request(&served.addr, "POST", "/tools/leaky", Some(json!({"url": "x", "mode": mode})));
        assert_eq!(status, 500, "{body}");
        assert!(body.contains("[redacted ${CTX_HE_API_KEY}]"), "{mode}: {body}");
        assert_clean(mode, &body);
    }

    // A load problem that quotes a secret: /health and the log show it redacted.
    let (status, health) = request(&served.addr, "GET", "/health", None);
    assert_eq!(status, 200, "{health}");
    assert!(health.contains("cannot start with key [redacted ${CTX_HE_BOOT}]"), "{health}");
    assert_clean("/health", &health);

    // The server writes its log from another thread: wait (bounded) for the script's line.
    let wanted = "calling with key [redacted ${CTX_HE_API_KEY}]";
    let waited = std::time::Instant::now();
    while !served.stderr.lock().unwrap().contains(wanted) && waited.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let log = served.stderr.lock().unwrap().clone();
    assert!(log.contains(wanted), "the script's log line:\n{log}");
    assert_clean("the server log", &log);
}

#[test]
fn config_errors_never_print_expanded_secrets() {
    let check = |config: &str, env: &[(&str, &str)], args: &[&str]| {
        let ws = Workspace::new(config);
        let mut command = Command::new(BIN);
        command.current_dir(ws.path()).args(["--config", "ctx.toml"]).args(args).env_remove("CTX_CONFIG");
        for (k, v) in env {
            command.env(k, v);
        }
        let out = command.output().unwrap();
        assert!(!out.status.success(), "a bad config must fail");
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };

    // The reproduction: a token too short for server.auth_token.
    for args in [&["serve"][..], &["schema", "check"][..]] {
        let out = check("[server]\nauth_token = \"${CTX_TOKEN}\"\n", &[("CTX_TOKEN", "short-sekrit")], args);
        assert!(out.contains("server.auth_token (line 2)"), "{out}");
        assert!(out.contains("[redacted ${CTX_TOKEN}]"), "{out}");
        assert!(!out.contains("short-sekrit"), "{args:?} printed the token:\n{out}");
    }

    // However short: the value of an expanded key is never echoed.
    let out = check("[server]\nauth_token = \"${CTX_TOKEN}\"\n", &[("CTX_TOKEN", "ab1")], &["serve"]);
    assert!(out.contains("got \"[redacted ${CTX_TOKEN}]\""), "{out}");
    assert!(!out.contains("\"ab1\""), "{out}");

    // A long value that messages cut short is hidden whole, cut included.
    let long = format!("ftp://{}", "very-long-secret-host-name-".repeat(4));
    let out = check("[embedding]\nurl = \"${CTX_EMBED_URL}\"\n", &[("CTX_EMBED_URL", &long)], &["serve"]);
    assert!(out.contains("embedding.url (line 2)") && out.contains("[redacted ${CTX_EMBED_URL}]"), "{out}");
    assert!(!out.contains("very-long-secret"), "{out}");
}
