//! The command line: help, init, config errors, exit codes.

use crate::common::{run_in, Workspace};

#[test]
fn help_is_stable() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_in(dir.path(), &["--help"]);
    insta::assert_snapshot!("ctx_help", run.ok());
}

#[test]
fn init_then_check_passes_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    run_in(dir.path(), &["init", "ws"]).ok();
    for file in ["ws/ctx.toml", "ws/tools/echo.lua", "ws/docs/welcome.md"] {
        assert!(dir.path().join(file).is_file(), "{file} written");
    }
    assert!(dir.path().join("ws/data").is_dir());
    let check = run_in(dir.path(), &["--config", "ws/ctx.toml", "schema", "check"]);
    assert!(check.ok().starts_with("ok: ws/ctx.toml is valid"));

    // A second init refuses, exits 2, and leaves the edited config alone.
    std::fs::write(dir.path().join("ws/ctx.toml"), "# mine\n").unwrap();
    let again = run_in(dir.path(), &["init", "ws"]);
    assert_eq!(again.code(), 2);
    assert!(again.stderr().contains("pass --force"), "{}", again.stderr());
    assert_eq!(std::fs::read_to_string(dir.path().join("ws/ctx.toml")).unwrap(), "# mine\n");
    run_in(dir.path(), &["init", "ws", "--force"]).ok();
    assert_ne!(std::fs::read_to_string(dir.path().join("ws/ctx.toml")).unwrap(), "# mine\n");
}

#[test]
fn broken_config_lists_every_problem_with_exit_2() {
    let ws = Workspace::new(
        "[db]\npth = \"x\"\n\n[chunking]\nmax_tokens = 0\n\n[tools.script.jira]\npath = \"jira.lua\"\ntimeout = \"30s\"\napi_token = \"${CTX_TEST_SURELY_UNSET}\"\n\n[connectors.filesystem.\"bad name\"]\nroot = \"docs\"\n\n[server]\nallowed_origins = \"*\"\n",
    );
    let run = ws.ctx(&["schema", "check"]);
    assert_eq!(run.code(), 2);
    assert!(run.stdout().is_empty());
    insta::assert_snapshot!("config_errors", run.stderr());
}

#[test]
fn toml_syntax_error_has_line_and_exit_2() {
    let ws = Workspace::new("[db]\npath = \"a\"\n[server\nbind = 1\n");
    let run = ws.ctx(&["schema", "check"]);
    assert_eq!(run.code(), 2);
    assert!(run.stderr().contains("(line 3)"), "{}", run.stderr());
    // Any command that needs the config fails the same way, without a panic or a Debug dump.
    let sync = ws.ctx(&["sync"]);
    assert_eq!(sync.code(), 2);
    assert!(sync.stderr().starts_with("error: ctx.toml:3:"), "{}", sync.stderr());
    assert!(!sync.stderr().contains("panicked"));
}

#[test]
fn missing_and_unreadable_config_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_in(dir.path(), &["schema", "check"]);
    assert_eq!(run.code(), 2);
    assert!(run.stderr().contains("no config file at ctx.toml (the default ./ctx.toml)"), "{}", run.stderr());
    assert!(run.stderr().contains("ctx init"));

    std::fs::create_dir(dir.path().join("folder.toml")).unwrap();
    let run = run_in(dir.path(), &["--config", "folder.toml", "stats"]);
    assert_eq!(run.code(), 2);
    assert!(run.stderr().contains("cannot read config file folder.toml"), "{}", run.stderr());
}

#[test]
fn config_env_var_is_the_second_lookup() {
    let ws = Workspace::new("[db]\npath = \"data/other.sqlite\"\n");
    let out = std::process::Command::new(crate::common::BIN)
        .args(["stats", "--json"])
        .current_dir(std::env::temp_dir())
        .env("CTX_CONFIG", ws.path().join("ctx.toml"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(ws.path().join("data/other.sqlite").is_file(), "paths resolve against the config's folder");
}

#[test]
fn missing_env_var_names_variable_and_key() {
    let ws = Workspace::new("[tools.script.jira]\npath = \"jira.lua\"\ntoken = \"Bearer ${CTX_TEST_NOPE}\"\n");
    let run = ws.ctx(&["schema", "check"]);
    assert_eq!(run.code(), 2);
    assert!(
        run.stderr().contains("tools.script.jira.token (line 3): environment variable CTX_TEST_NOPE is not set"),
        "{}",
        run.stderr()
    );
}

#[test]
fn usage_errors_exit_2_and_completions_work() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(run_in(dir.path(), &["no-such-command"]).code(), 2);
    assert_eq!(run_in(dir.path(), &["search"]).code(), 2);
    let bash = run_in(dir.path(), &["completions", "bash"]).ok();
    assert!(bash.contains("_ctx()"), "bash completion defines _ctx");
}

#[test]
fn schema_check_loads_every_script_in_the_sandbox() {
    let ws = Workspace::new(
        "[connectors.script.good]\npath = \"good.lua\"\n[connectors.script.syntax]\npath = \"syntax.lua\"\n[connectors.script.noscan]\npath = \"noscan.lua\"\n[connectors.script.evil]\npath = \"evil.lua\"\ntimeout = 1\n[tools.script.echo]\npath = \"echo.lua\"\n",
    );
    ws.write("good.lua", "connector = {} function connector.scan() return {} end");
    ws.write("syntax.lua", "connector = {");
    ws.write("noscan.lua", "return { name = 'x' }");
    ws.write("evil.lua", "os.execute('true')");
    std::fs::copy(crate::common::repo().join("tools/echo.lua"), ws.path().join("echo.lua")).unwrap();
    let run = ws.ctx(&["schema", "check"]);
    assert_eq!(run.code(), 2);
    let err = run.stderr();
    assert!(err.contains("has 3 problem(s)"), "{err}");
    assert!(err.contains("connectors.script.syntax: syntax.lua:1:"), "{err}");
    assert!(err.contains("connectors.script.noscan: noscan.lua: `connector.scan` is not defined"), "{err}");
    assert!(err.contains("connectors.script.evil: evil.lua:1: attempt to call a nil value (field 'execute')"), "{err}");
    assert!(!err.contains("good"), "{err}");
    assert!(!err.contains("echo"), "{err}");
}

/// Whether a line of the generated config is a commented-out example (`# key = value`,
/// `# [section]`, `# [[array]]`) rather than prose.
fn commented_example(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("# ")?;
    let key: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || "_-.".contains(*c)).collect();
    (rest.starts_with('[') || (!key.is_empty() && rest[key.len()..].starts_with(" = "))).then_some(rest)
}

/// The config `ctx init` writes has an example of every section, and every example is valid:
/// with each "# " deleted (all at once), and the files and variables they name in place, the
/// config passes `ctx schema check`, and its sections are every section of the config schema.
#[test]
fn every_commented_example_in_the_init_config_is_valid_uncommented() {
    let dir = tempfile::tempdir().unwrap();
    run_in(dir.path(), &["init", "ws"]).ok();
    let ws = dir.path().join("ws");
    let text = std::fs::read_to_string(ws.join("ctx.toml")).unwrap();
    let mut uncommented = 0;
    let config: String = text
        .lines()
        .map(|line| match commented_example(line) {
            Some(example) => {
                uncommented += 1;
                format!("{example}\n")
            }
            None => format!("{line}\n"),
        })
        .collect();
    assert!(uncommented >= 40, "only {uncommented} example lines:\n{text}");
    for header in [
        "[[server.tokens]]",
        "[[server.rate_limits]]",
        "[connectors.git.handbook]",
        "[connectors.script.wiki]",
        "[tools.scripted.triage]",
        "[approval]",
        "[mcp]",
        "[mcp.servers.time]",
        "[mcp.servers.github]",
    ] {
        assert!(config.lines().any(|l| l == header), "no example of {header}");
    }
    // Every top-level section of the schema is there.
    let parsed: toml::Table = config.parse().unwrap_or_else(|e| panic!("{e}\n{config}"));
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(crate::common::repo().join("schemas/config.schema.json")).unwrap(),
    )
    .unwrap();
    for section in schema["properties"].as_object().unwrap().keys() {
        assert!(parsed.contains_key(section), "no [{section}] in the generated config");
    }
    std::fs::write(ws.join("ctx.toml"), &config).unwrap();
    // What the examples name: the connector's script, the imported file, the variables.
    run_in(&ws, &["connector", "init", "wiki"]).ok();
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".cursor")).unwrap();
    std::fs::write(home.join(".cursor/mcp.json"), r#"{"mcpServers": {}}"#).unwrap();
    // `[db] url`'s example names a server that is not here: the check connects to the tests'
    // database instead (CTX_DATABASE_URL wins over the file).
    let Some(db) = ctx::db::testing::database() else { return };
    let output = std::process::Command::new(crate::common::BIN)
        .args(["--config", "ctx.toml", "schema", "check"])
        .current_dir(&ws)
        .env("CTX_DATABASE_URL", &db.url)
        .env("HOME", &home)
        .env("CTX_TOKEN", "admin-token-0123456789abcdef")
        .env("CTX_CI_TOKEN", "ci-token-0123456789abcdef")
        .env("CTX_APPROVER_TOKEN", "approver-token-0123456789")
        .env("GITHUB_TOKEN", "ghp_example")
        .env("OPENAI_API_KEY", "sk-example")
        .env_remove("CTX_CONFIG")
        .env_remove("CTX_LOG")
        .output()
        .unwrap();
    let check = crate::common::Run(output);
    assert!(check.ok().starts_with("ok: ctx.toml is valid"), "{}\n{config}", check.stderr());
    assert!(check.ok().contains("database: PostgreSQL"), "{}", check.ok());
}
