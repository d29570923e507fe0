//! Commands that do not serve: they need none of the server's secrets, start only the upstream
//! servers a script names, and hand the work to the `ctx serve` running for the config when
//! there is one.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::common::{ServeChild, Workspace, BIN};
use crate::gateway::fault_bin;

/// The server's secrets, referenced and not set in the command's environment.
const SECRETS: &str = r#"
[server]
auth_token = "${CTX_TEST_UNSET_TOKEN}"

[[server.tokens]]
name = "bot"
token = "${CTX_TEST_UNSET_BOT}"
tools = ["search"]

[approval]
approver_token = "${CTX_TEST_UNSET_APPROVER}"
"#;

fn ctx(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .current_dir(dir)
        .args(args)
        .env_remove("CTX_CONFIG")
        .env_remove("CTX_LOG")
        .env_remove("CTX_TEST_UNSET_TOKEN")
        .env_remove("CTX_TEST_UNSET_BOT")
        .env_remove("CTX_TEST_UNSET_APPROVER")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn commands_that_do_not_serve_need_none_of_the_servers_tokens() {
    let ws = Workspace::new(SECRETS);
    ws.write("two.lua", "return 1 + 1");
    for args in [&["search", "deploy"][..], &["log"], &["run", "two.lua"], &["approvals", "list"], &["tool", "list"]] {
        let out = ctx(ws.path(), args);
        let said = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "ctx {args:?}: {said}{}", text(&out.stdout));
        assert!(!said.contains("CTX_TEST_UNSET"), "ctx {args:?} mentions the server's secrets: {said}");
    }
    // Approving an unknown id fails for that reason only.
    let out = ctx(ws.path(), &["approvals", "approve", "ap-nothing"]);
    let said = text(&out.stderr);
    assert!(said.contains("ap-nothing") && !said.contains("CTX_TEST_UNSET"), "{said}");
}

#[test]
fn serving_names_each_unset_variable_once() {
    let ws = Workspace::new(SECRETS);
    let out = ctx(ws.path(), &["serve", "--bind", "127.0.0.1:0"]);
    assert_eq!(out.status.code(), Some(2));
    let said = text(&out.stderr);
    for var in ["CTX_TEST_UNSET_TOKEN", "CTX_TEST_UNSET_BOT", "CTX_TEST_UNSET_APPROVER"] {
        let line = format!("environment variable {var} is not set (referenced as ${{{var}}})");
        assert_eq!(said.matches(&line).count(), 1, "{var} once, by name: {said}");
    }
    assert!(!said.contains("redacted") && !said.contains("at least 16 characters"), "{said}");
    assert!(said.contains("3 problem(s)"), "{said}");
}

/// Ten upstream servers, each recording its starts in `starts/<name>`.
fn ten_servers(ws: &Workspace) -> String {
    std::fs::create_dir_all(ws.path().join("starts")).unwrap();
    (1..=10)
        .map(|i| {
            let starts = ws.path().join(format!("starts/s{i}"));
            format!(
                "[mcp.servers.s{i}]\ncommand = {:?}\nargs = [\"--starts\", {:?}]\n\n",
                fault_bin().display().to_string(),
                starts.display().to_string()
            )
        })
        .collect()
}

fn started(ws: &Workspace) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(ws.path().join("starts"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    names
}

#[test]
fn ctx_run_starts_only_the_upstream_servers_its_script_names() {
    let ws = Workspace::new("");
    let config = ten_servers(&ws);
    std::fs::write(ws.path().join("ctx.toml"), config).unwrap();
    ws.write("two.lua", "return 1 + 1");
    ws.write("s3.lua", "return s3.echo({text = 'hi'}):await().text");
    let out = ctx(ws.path(), &["run", "two.lua"]);
    assert_eq!((out.status.code(), text(&out.stdout).trim()), (Some(0), "2"), "{}", text(&out.stderr));
    assert!(started(&ws).is_empty(), "a script that names no server started {:?}", started(&ws));
    let out = ctx(ws.path(), &["run", "s3.lua"]);
    assert_eq!((out.status.code(), text(&out.stdout).trim()), (Some(0), "hi"), "{}", text(&out.stderr));
    assert_eq!(started(&ws), ["s3"]);
}

#[test]
fn ctx_run_and_ctx_catalog_use_the_running_server_and_start_nothing() {
    let ws = Workspace::new("");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = format!("[server]\nbind = \"127.0.0.1:{port}\"\n\n{}", ten_servers(&ws));
    std::fs::write(ws.path().join("ctx.toml"), config).unwrap();
    ws.write("s3.lua", "return s3.echo({text = 'from the server'}):await().text");
    let serve = ServeChild::spawn(Command::new(BIN).current_dir(ws.path()).env_remove("CTX_CONFIG").arg("serve"));
    // The server's own ten starts.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while started(&ws).len() < 10 {
        assert!(std::time::Instant::now() < deadline, "the server started {:?}", started(&ws));
        std::thread::sleep(Duration::from_millis(50));
    }
    let count = |ws: &Workspace| -> usize {
        started(ws)
            .iter()
            .map(|s| std::fs::read_to_string(ws.path().join("starts").join(s)).unwrap().lines().count())
            .sum()
    };
    let before = count(&ws);

    let out = ctx(ws.path(), &["run", "s3.lua"]);
    assert_eq!((out.status.code(), text(&out.stdout).trim()), (Some(0), "from the server"), "{}", text(&out.stderr));
    let out = ctx(ws.path(), &["catalog"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let catalog = text(&out.stdout);
    assert!((1..=10).all(|i| catalog.contains(&format!("s{i}.echo"))), "{catalog}");
    assert_eq!(count(&ws), before, "the commands started servers of their own");

    // The script ran on the server: its call log has the run.
    let calls: Value = reqwest_get(&format!("http://{}/calls?tool=execute", serve.addr));
    assert_eq!(calls["calls"].as_array().map(Vec::len), Some(1), "{calls}");
    // --local runs it here, starting only s3.
    let out = ctx(ws.path(), &["run", "--local", "s3.lua"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(count(&ws), before + 1);
}

fn reqwest_get(url: &str) -> Value {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async { reqwest::get(url).await.unwrap().json().await.unwrap() })
}
