//! `[mcp]` in ctx.toml and `mcp.import` of a Claude Desktop / Cursor file,
//! resolved into `Config::upstreams`, isolated per server, and reported by `ctx schema check`.

use std::collections::BTreeMap;
use std::process::Command;

use ctx::config::upstream::{Expose, UpstreamSection, UpstreamTransport, DEFAULT_TIMEOUT};
use ctx::config::Config;

use crate::common::{load_config as load, repo, Run, Workspace, BIN};

/// `ctx --config ctx.toml schema check` with `vars` added to the environment.
fn check(ws: &Workspace, vars: &[(&str, &str)]) -> Run {
    let output = Command::new(BIN)
        .args(["--config", "ctx.toml", "schema", "check"])
        .current_dir(ws.path())
        .env_remove("CTX_CONFIG")
        .env_remove("CTX_LOG")
        .envs(vars.iter().copied())
        .output()
        .expect("run ctx");
    Run(output)
}

fn fixture(ws: &Workspace, name: &str) {
    let text = std::fs::read_to_string(repo().join("tests/fixtures/mcp_import").join(name)).unwrap();
    ws.write(name, &text);
}

fn server<'a>(config: &'a Config, name: &str) -> &'a UpstreamSection {
    config
        .upstreams
        .iter()
        .find(|u| u.name == name)
        .unwrap_or_else(|| panic!("no server {name}: {:?}", config.upstreams))
}

fn stdio(section: &UpstreamSection) -> (&str, &[String], &BTreeMap<String, String>) {
    match &section.transport {
        UpstreamTransport::Stdio { command, args, env, .. } => (command, args, env),
        other => panic!("{} is not stdio: {other:?}", section.name),
    }
}

fn http(section: &UpstreamSection) -> (&str, &BTreeMap<String, String>) {
    match &section.transport {
        UpstreamTransport::Http { url, headers } => (url, headers),
        other => panic!("{} is not http: {other:?}", section.name),
    }
}

#[test]
fn stdio_and_http_servers_resolve() {
    let ws = Workspace::new(
        r#"
[mcp]
expose = "discover"

[mcp.servers.everything]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-everything"]
cwd = "servers"
tools = ["echo", "get_*"]
exclude = ["get_env"]
timeout = 10
required = true

[mcp.servers.remote]
url = "https://mcp.example.com/mcp"
headers = { Authorization = "Bearer ${CONFIG_17_REMOTE_TOKEN}" }
expose = "all"
enabled = false
"#,
    );
    let config = load(&ws, &[("CONFIG_17_REMOTE_TOKEN", "tok-0123456789")]).unwrap();
    assert!(config.upstreams.iter().map(|u| u.name.as_str()).eq(["everything", "remote"]));
    let everything = server(&config, "everything");
    let (command, args, _) = stdio(everything);
    assert_eq!((command, args), ("npx", &["-y".to_string(), "@modelcontextprotocol/server-everything".into()][..]));
    let UpstreamTransport::Stdio { cwd, .. } = &everything.transport else { unreachable!() };
    assert_eq!(cwd.as_deref(), Some(ws.path().join("servers").as_path()));
    assert!(everything.allows("echo") && everything.allows("get_sum") && !everything.allows("get_env"));
    assert!(!everything.allows("add"));
    assert_eq!(everything.timeout, std::time::Duration::from_secs(10));
    assert!(everything.required && everything.enabled);
    assert_eq!(everything.expose, Expose::Discover, "the global mcp.expose is the default");
    assert_eq!(everything.origin, "ctx.toml");
    let remote = server(&config, "remote");
    let (url, headers) = http(remote);
    assert_eq!(url, "https://mcp.example.com/mcp");
    assert_eq!(headers.get("Authorization").map(String::as_str), Some("Bearer tok-0123456789"));
    assert_eq!((remote.expose, remote.enabled, remote.timeout), (Expose::All, false, DEFAULT_TIMEOUT));

    // The real binary agrees and counts them (the cwd must exist).
    std::fs::create_dir(ws.path().join("servers")).unwrap();
    let run = check(&ws, &[("CONFIG_17_REMOTE_TOKEN", "tok-0123456789")]);
    assert!(run.ok().contains("2 upstream MCP server(s)"), "{}", run.stdout());
}

#[test]
fn child_env_is_the_allow_list_and_nothing_else() {
    let ws = Workspace::new(
        r#"
[mcp.servers.plain]
command = "server"
env = { OWN = "mine" }

[mcp.servers.extra]
command = "server"
pass_env = ["CONFIG_17_EXTRA"]
"#,
    );
    let vars = [
        ("PATH", "/usr/local/bin:/usr/bin"),
        ("HOME", "/home/someone"),
        ("CONFIG_17_SECRET", "ctx-only-secret"),
        ("CONFIG_17_EXTRA", "passed"),
        ("OPENAI_API_KEY", "sk-ctx-own"),
    ];
    let config = load(&ws, &vars).unwrap();
    let (_, _, plain) = stdio(server(&config, "plain"));
    let expected: BTreeMap<String, String> =
        [("HOME", "/home/someone"), ("OWN", "mine"), ("PATH", "/usr/local/bin:/usr/bin")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into_iter()
            .collect();
    assert_eq!(plain, &expected);
    let (_, _, extra) = stdio(server(&config, "extra"));
    assert_eq!(extra.get("CONFIG_17_EXTRA").map(String::as_str), Some("passed"));
    for section in &config.upstreams {
        let (_, _, env) = stdio(section);
        for secret in ["CONFIG_17_SECRET", "OPENAI_API_KEY"] {
            assert!(!env.contains_key(secret), "{secret} reached {}", section.name);
        }
        assert!(!env.values().any(|v| v.contains("ctx-only-secret") || v.contains("sk-ctx-own")));
    }
}

#[test]
fn command_and_url_both_or_neither_is_a_clear_error() {
    let ws = Workspace::new(
        "[mcp.servers.both]\ncommand = \"npx\"\nurl = \"https://h/mcp\"\n\n[mcp.servers.neither]\nargs = [\"x\"]\n\n[mcp.servers.ftp]\nurl = \"ftp://h/mcp\"\n",
    );
    let run = check(&ws, &[]);
    assert_eq!(run.code(), 2, "{}{}", run.stdout(), run.stderr());
    let stderr = run.stderr();
    for line in [
        "mcp.servers.both (line 1): sets both command and url",
        "mcp.servers.neither (line 5): sets neither command nor url; give command (and args) to run a stdio server, or url for a Streamable HTTP server",
        "mcp.servers.ftp.url (line 9): expected an http:// or https:// URL",
    ] {
        assert!(stderr.contains(line), "{line}\n{stderr}");
    }
    assert!(stderr.contains("has 3 problem(s)"), "{stderr}");
}

#[test]
fn import_claude_desktop_file_as_it_is() {
    let ws = Workspace::new("[mcp]\nimport = \"claude_desktop_config.json\"\n");
    fixture(&ws, "claude_desktop_config.json");
    let config = load(&ws, &[("PATH", "/usr/bin"), ("CONFIG_17_SECRET", "never")]).unwrap();
    assert!(config.upstreams.iter().map(|u| u.name.as_str()).eq(["filesystem", "github", "sqlite"]));
    let (command, args, env) = stdio(server(&config, "filesystem"));
    assert_eq!(command, "npx");
    assert_eq!(args.len(), 4);
    assert!(env.keys().eq(["PATH"]), "only the allow-list: {env:?}");
    let github = server(&config, "github");
    let (command, _, env) = stdio(github);
    assert_eq!(command, "docker");
    assert_eq!(env.get("GITHUB_PERSONAL_ACCESS_TOKEN").map(String::as_str), Some("ghp_fixtureNotARealToken0123456789"));
    assert_eq!(github.origin, "claude_desktop_config.json");
    assert!(github.enabled && !github.required && github.tools.is_empty());
    assert_eq!((github.timeout, github.expose), (DEFAULT_TIMEOUT, Expose::All));
    // "disabled": true keeps it configured but not started; autoApprove is Claude's own.
    assert!(!server(&config, "sqlite").enabled);
    assert!(config.broken.is_empty() && config.warnings.is_empty());
    assert_eq!(config.mcp_import.as_deref(), Some(ws.path().join("claude_desktop_config.json").as_path()));

    let run = check(&ws, &[]);
    assert!(run.ok().contains("3 upstream MCP server(s)"), "{}", run.stdout());
}

#[test]
fn import_cursor_file_with_env_colon_vars_and_http_type() {
    let ws = Workspace::new("[mcp]\nimport = \"cursor_mcp.json\"\nexpose = \"discover\"\npass_env = []\n");
    fixture(&ws, "cursor_mcp.json");
    let vars = [
        ("PATH", "/usr/bin"),
        ("CONFIG_17_TZ", "Europe/Paris"),
        ("CONFIG_17_TIME_KEY", "time-key-0123"),
        ("CONFIG_17_REMOTE_TOKEN", "remote-token-0123"),
    ];
    let config = load(&ws, &vars).unwrap();
    assert!(config.upstreams.iter().map(|u| u.name.as_str()).eq(["everything", "remote", "time"]));
    let (_, args, env) = stdio(server(&config, "time"));
    assert_eq!(args[1], "--local-timezone=Europe/Paris");
    // mcp.pass_env = [] passes nothing: PATH stays out.
    assert!(env.keys().eq(["TIME_API_KEY"]) && env["TIME_API_KEY"] == "time-key-0123", "{env:?}");
    let remote = server(&config, "remote");
    let (url, headers) = http(remote);
    assert_eq!((url, headers["Authorization"].as_str()), ("https://mcp.example.com/mcp", "Bearer remote-token-0123"));
    assert_eq!(remote.expose, Expose::Discover);
    assert_eq!(http(server(&config, "everything")).0, "http://127.0.0.1:3001/mcp");
    // The "sse" entry is refused alone, naming the file and saying what ctx speaks.
    let broken: Vec<&ctx::config::BrokenSection> = config.broken_upstreams().collect();
    assert_eq!(broken.len(), 1);
    let message = broken[0].message();
    assert!(
        message.starts_with("cursor_mcp.json: mcpServers.legacy.type: \"sse\" is the old HTTP+SSE transport, which ctx does not speak: ctx connects over Streamable HTTP"),
        "{message}"
    );
    assert!(message.contains("[mcpServers.legacy] is disabled"), "{message}");

    let run = check(&ws, &vars);
    assert_eq!(run.code(), 2, "{}{}", run.stdout(), run.stderr());
    assert!(
        run.stderr().contains("  - cursor_mcp.json: mcpServers.legacy.type: \"sse\" is the old"),
        "{}",
        run.stderr()
    );
    assert!(run.stderr().contains("has 1 problem(s)"), "{}", run.stderr());
}

#[test]
fn import_and_ctx_toml_define_one_server_ctx_toml_wins_with_a_warning() {
    let ws = Workspace::new(
        "[mcp]\nimport = \"claude_desktop_config.json\"\n\n[mcp.servers.github]\nurl = \"https://api.githubcopilot.com/mcp/\"\n",
    );
    fixture(&ws, "claude_desktop_config.json");
    let config = load(&ws, &[]).unwrap();
    let github = server(&config, "github");
    assert_eq!(http(github).0, "https://api.githubcopilot.com/mcp/");
    assert_eq!(github.origin, "ctx.toml");
    assert_eq!(config.upstreams.iter().filter(|u| u.name == "github").count(), 1);
    let warning = config.warnings.join("\n");
    assert!(
        warning.contains("ctx.toml: [mcp.servers.github] overrides the server \"github\" of the imported file claude_desktop_config.json"),
        "{warning}"
    );

    let run = check(&ws, &[]);
    assert!(run.ok().contains("3 upstream MCP server(s)"), "{}", run.stdout());
    assert!(run.stderr().contains("warning: ctx.toml: [mcp.servers.github] overrides"), "{}", run.stderr());
}

#[test]
fn malformed_or_missing_import_is_a_config_error_with_file_and_line() {
    let ws = Workspace::new("# servers come from the editor's file\n[mcp]\nimport = \"bad.json\"\n");
    ws.write("bad.json", "{\n  \"mcpServers\": {\n    \"a\": { \"command\": \"x\" },,\n  }\n}\n");
    let err = load(&ws, &[]).unwrap_err().to_string();
    assert!(err.contains("mcp.import (line 3): bad.json: invalid JSON at line 3, column 29:"), "{err}");
    let run = check(&ws, &[]);
    assert_eq!(run.code(), 2);
    assert!(run.stderr().contains("bad.json: invalid JSON at line 3, column 29"), "{}", run.stderr());
    assert!(run.stderr().contains("or remove mcp.import"), "{}", run.stderr());

    std::fs::remove_file(ws.path().join("bad.json")).unwrap();
    let run = check(&ws, &[]);
    assert_eq!(run.code(), 2);
    assert!(run.stderr().contains("mcp.import (line 3): the file to import, bad.json"), "{}", run.stderr());
    assert!(run.stderr().contains("does not exist; point mcp.import at"), "{}", run.stderr());

    ws.write("bad.json", "{\"servers\": {}}");
    let err = load(&ws, &[]).unwrap_err().to_string();
    assert!(err.contains("bad.json has no \"mcpServers\" object"), "{err}");
    // Any other command fails the same way, exit 2.
    let sync = ws.ctx(&["sync"]);
    assert_eq!(sync.code(), 2, "{}", sync.stderr());
}

#[test]
fn unset_var_disables_only_that_server() {
    let ws = Workspace::new(
        r#"[mcp]
import = "imported.json"

[mcp.servers.jira]
command = "jira-mcp"
env = { JIRA_TOKEN = "${CONFIG_17_SURELY_UNSET_JIRA}" }

[mcp.servers.time]
command = "uvx"
args = ["mcp-server-time"]
"#,
    );
    ws.write(
        "imported.json",
        r#"{"mcpServers": {"linear": {"url": "https://mcp.linear.app/mcp", "headers": {"Authorization": "Bearer ${env:CONFIG_17_SURELY_UNSET_LINEAR}"}}, "fetch": {"command": "uvx", "args": ["mcp-server-fetch"]}}}"#,
    );
    let config = load(&ws, &[]).unwrap();
    assert!(config.upstreams.iter().map(|u| u.name.as_str()).eq(["fetch", "time"]));
    let broken: Vec<String> = config.broken_upstreams().map(|b| b.section()).collect();
    assert_eq!(broken, ["mcp.servers.jira", "mcpServers.linear"]);
    let jira = config.broken_upstreams().next().unwrap().message();
    assert!(
        jira.starts_with("ctx.toml: mcp.servers.jira.env.JIRA_TOKEN (line 6): environment variable CONFIG_17_SURELY_UNSET_JIRA is not set"),
        "{jira}"
    );
    let linear = config.broken_upstreams().nth(1).unwrap().message();
    assert!(
        linear.starts_with("imported.json: mcpServers.linear.headers.Authorization: environment variable CONFIG_17_SURELY_UNSET_LINEAR is not set"),
        "{linear}"
    );
    // No script section is caught up in it.
    assert_eq!(config.broken_of(ctx::config::ScriptKind::Tool).count(), 0);

    let run = check(&ws, &[]);
    assert_eq!(run.code(), 2, "{}{}", run.stdout(), run.stderr());
    let stderr = run.stderr();
    assert!(
        stderr.contains(
            "  - mcp.servers.jira.env.JIRA_TOKEN (line 6): environment variable CONFIG_17_SURELY_UNSET_JIRA is not set"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("  - imported.json: mcpServers.linear.headers.Authorization: environment variable CONFIG_17_SURELY_UNSET_LINEAR is not set"), "{stderr}");
    assert!(stderr.contains("has 2 problem(s)"), "{stderr}");
    // With the variables set, the same config checks clean.
    let run = check(&ws, &[("CONFIG_17_SURELY_UNSET_JIRA", "j"), ("CONFIG_17_SURELY_UNSET_LINEAR", "l")]);
    assert!(run.ok().contains("4 upstream MCP server(s)"), "{}", run.stdout());
}

#[test]
fn schema_check_looks_for_the_command_and_the_cwd() {
    let ws = Workspace::new(
        "[mcp.servers.local]\ncommand = \"./bin/server\"\n\n[mcp.servers.gone]\ncommand = \"config-17-no-such-program\"\n\n[mcp.servers.nowhere]\ncommand = \"sh\"\ncwd = \"no-such-folder\"\n\n[mcp.servers.off]\ncommand = \"config-17-no-such-program\"\nenabled = false\n",
    );
    ws.write("bin/server", "#!/bin/sh\n");
    let run = check(&ws, &[]);
    assert_eq!(run.code(), 2, "{}{}", run.stdout(), run.stderr());
    let stderr = run.stderr();
    assert!(stderr.contains("mcp.servers.nowhere.cwd: folder"), "{stderr}");
    assert!(stderr.contains("has 1 problem(s)"), "{stderr}");
    assert!(
        stderr.contains("warning: mcp.servers.gone.command: \"config-17-no-such-program\" is not on the server's PATH; ctx serve will keep trying to start it"),
        "{stderr}"
    );
    // The script next to the config is found; a disabled server is not looked for.
    assert!(!stderr.contains("mcp.servers.local") && !stderr.contains("mcp.servers.off"), "{stderr}");

    std::fs::create_dir(ws.path().join("no-such-folder")).unwrap();
    let run = check(&ws, &[]);
    assert!(run.ok().contains("4 upstream MCP server(s)"), "{}", run.stderr());
}

#[test]
fn server_variables_are_reserved_from_lua_scripts() {
    let ws = Workspace::new(
        "[mcp]\nimport = \"cursor_mcp.json\"\n\n[mcp.servers.jira]\ncommand = \"jira-mcp\"\nenv = { JIRA_TOKEN = \"${CONFIG_17_JIRA}\" }\n\n[tools.script.t]\npath = \"t.lua\"\nallow_env = [\"CONFIG_17_JIRA\", \"CONFIG_17_REMOTE_TOKEN\"]\n",
    );
    fixture(&ws, "cursor_mcp.json");
    let vars = [
        ("CONFIG_17_JIRA", "j"),
        ("CONFIG_17_TZ", "UTC"),
        ("CONFIG_17_TIME_KEY", "k"),
        ("CONFIG_17_REMOTE_TOKEN", "r"),
    ];
    let config = load(&ws, &vars).unwrap();
    let script = config.scripts.iter().find(|s| s.name == "t").unwrap();
    let reserved: Vec<(&str, &str)> = script.reserved_env.iter().map(|r| (r.var.as_str(), r.key.as_str())).collect();
    // env.get never reads a variable an upstream server uses, from ctx.toml or the import.
    assert!(reserved.contains(&("CONFIG_17_JIRA", "mcp.servers.jira.env.JIRA_TOKEN")), "{reserved:?}");
    assert!(reserved.contains(&("CONFIG_17_REMOTE_TOKEN", "mcpServers.remote.headers.Authorization")), "{reserved:?}");
}
