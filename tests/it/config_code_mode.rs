//! The config side of code mode: `[code_mode]` and `[tools.scripted.<name>]`, resolved into
//! `Config::code_mode` and `Config::scripted`, and reported by `ctx schema check`.

use std::time::Duration;

use ctx::config::code_mode::{CodeLimits, CodeMode, ScriptedSection};

use crate::common::{load_config as load, Run, Workspace};

/// The problems of a config that must not load, one per line as `ctx` prints them.
fn problems(config: &str) -> String {
    let ws = Workspace::new(config);
    match load(&ws, &[]) {
        Ok(_) => panic!("loaded:\n{config}"),
        Err(err) => err.to_string(),
    }
}

fn assert_has(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
}

fn check(ws: &Workspace) -> Run {
    ws.ctx(&["schema", "check"])
}

#[test]
fn defaults_when_absent() {
    let ws = Workspace::new("[db]\npath = \"data/ctx.sqlite\"\n");
    let config = load(&ws, &[]).unwrap();
    assert_eq!(config.code_mode, CodeMode::default());
    assert!(config.scripted.is_empty());
    // The documented defaults, spelled out: the schema's defaults and the Rust ones agree.
    let limits = &config.code_mode.limits;
    assert_eq!(limits.timeout, Duration::from_secs(30));
    assert_eq!(limits.memory_bytes, 64 * 1024 * 1024);
    assert_eq!(limits.max_instructions, 500_000_000);
    assert_eq!((limits.max_calls, limits.max_concurrent), (100, 16));
    assert_eq!((limits.max_output_bytes, limits.max_log_lines), (1024 * 1024, 100));
    let cm = &config.code_mode;
    assert!(cm.enabled && !cm.allow_private);
    assert!(cm.destructive.is_empty() && cm.allow_destructive.is_empty());
    assert_eq!((&cm.allow_hosts, &cm.allow_env, &cm.fs_root), (&None, &None, &None));
    // An empty section is the same as none.
    let ws = Workspace::new("[code_mode]\n");
    assert_eq!(load(&ws, &[]).unwrap().code_mode, CodeMode::default());
}

#[test]
fn every_key_parsed() {
    let ws = Workspace::new(
        r#"
[code_mode]
enabled = false
timeout = 12
memory_mb = 32
max_instructions = 1000000
max_calls = 5
max_concurrent = 2
max_output_bytes = 4096
max_log_lines = 0
destructive = ["*__delete_*", "drop_table"]
allow_destructive = ["jira__delete_comment"]
allow_hosts = ["api.example.com", "${CONFIG_18_HOST}"]
allow_private = true
allow_env = ["LANG"]
fs_root = "shared"
"#,
    );
    std::fs::create_dir(ws.path().join("shared")).unwrap();
    let config = load(&ws, &[("CONFIG_18_HOST", "10.0.0.0/8")]).unwrap();
    let cm = &config.code_mode;
    assert!(!cm.enabled);
    assert_eq!(
        cm.limits,
        CodeLimits {
            timeout: Duration::from_secs(12),
            memory_bytes: 32 * 1024 * 1024,
            max_instructions: 1_000_000,
            max_calls: 5,
            max_concurrent: 2,
            max_output_bytes: 4096,
            max_log_lines: 0,
        }
    );
    assert_eq!(cm.destructive, ["*__delete_*", "drop_table"]);
    assert_eq!(cm.allow_destructive, ["jira__delete_comment"]);
    assert!(cm.destructive_set().is_match("jira__delete_issue") && !cm.destructive_set().is_match("jira__get"));
    assert!(cm.allow_destructive_set().is_match("jira__delete_comment"));
    assert_eq!(cm.allow_hosts.as_deref(), Some(&["api.example.com".to_string(), "10.0.0.0/8".into()][..]));
    assert!(cm.allow_private);
    assert_eq!(cm.allow_env.as_deref(), Some(&["LANG".to_string()][..]));
    // Absolute and canonical, whatever the temporary folder's path goes through.
    let root = cm.fs_root.as_deref().unwrap();
    assert!(root.is_absolute());
    assert_eq!(root, ws.path().join("shared").canonicalize().unwrap());
}

#[test]
fn bad_values_name_the_key_and_line() {
    let text = problems(
        r#"[code_mode]
enabled = "yes"
timeout = 0
memory_mb = "64MiB"
max_instructions = 10
max_calls = 10001
max_concurrent = 65
max_output_bytes = 1
max_log_lines = -1
destructive = "drop_*"
allow_hosts = []
allow_env = ["LANG", ""]
fs_root = 7
surprise = 1

[tools.scripted.flow]
tools = ["search"]
timeout = 3601
memory = 12

[tools.scripted.empty]
description = "d"
tools = []
"#,
    );
    assert_has(
        &text,
        &[
            "code_mode.enabled (line 2): expected boolean, got \"yes\"",
            "code_mode.timeout (line 3): expected integer between 1 and 3600, got 0",
            "code_mode.memory_mb (line 4): expected integer between 1 and 4096, got \"64MiB\"",
            "code_mode.max_instructions (line 5): expected integer between 1000 and 1000000000000, got 10",
            "code_mode.max_calls (line 6): expected integer between 1 and 10000, got 10001",
            "code_mode.max_concurrent (line 7): expected integer between 1 and 64, got 65",
            "code_mode.max_output_bytes (line 8): expected integer between 1024 and 67108864, got 1",
            "code_mode.max_log_lines (line 9): expected integer between 0 and 100000, got -1",
            "code_mode.destructive (line 10): expected array of non-empty string, got \"drop_*\"",
            "code_mode.allow_hosts (line 11): expected at least 1 item, got 0",
            "code_mode.allow_env.1 (line 12): expected non-empty string, got \"\"",
            "code_mode.fs_root (line 13): expected non-empty string, got 7",
            "code_mode.surprise (line 14): unknown key; expected one of: enabled, timeout, memory_mb",
            "tools.scripted.flow.description (line 16): missing; expected non-empty string",
            "tools.scripted.flow.timeout (line 18): expected integer between 1 and 3600, got 3601",
            "tools.scripted.flow.memory (line 19): unknown key; expected one of: description, title, tools, timeout",
            "tools.scripted.empty.tools (line 23): expected at least 1 item, got 0",
        ],
    );
    assert!(text.contains("has 17 problem(s)"), "{text}");
    // A host rule that looks like a CIDR range and is not one is refused as in a script section.
    let text = problems("[code_mode]\nallow_hosts = [\"ok.example.com\", \"10.0.0.0/40\"]\n");
    assert_has(&text, &["code_mode.allow_hosts.1 (line 2): \"10.0.0.0/40\" is not a CIDR range"]);
}

#[test]
fn a_bad_glob_names_the_key_and_line() {
    let text = problems(
        "[code_mode]\ndestructive = [\"ok_*\", \"bad[\"]\nallow_destructive = [\"{a,b\"]\n\n[tools.scripted.flow]\ndescription = \"d\"\ntools = [\"search\", \"jira__[\"]\n",
    );
    assert_has(
        &text,
        &[
            "code_mode.destructive.1 (line 2): not a valid glob pattern: unclosed character class",
            "code_mode.allow_destructive.0 (line 3): not a valid glob pattern: unclosed alternate group",
            "tools.scripted.flow.tools.1 (line 7): not a valid glob pattern: unclosed character class",
        ],
    );
    assert!(text.contains("has 3 problem(s)"), "{text}");
}

#[test]
fn fs_root_must_be_an_existing_folder() {
    let text = problems("[code_mode]\nfs_root = \"nowhere\"\n");
    assert_has(&text, &["code_mode.fs_root (line 2): folder \"nowhere\" does not exist", "create it or fix fs_root"]);
    let ws = Workspace::new("[code_mode]\n\nfs_root = \"notes.txt\"\n");
    ws.write("notes.txt", "a file");
    let text = load(&ws, &[]).unwrap_err().to_string();
    assert_has(&text, &["code_mode.fs_root (line 3): \"notes.txt\" is not a folder"]);
    // From the environment, and absolute: the same check.
    let ws = Workspace::new("[code_mode]\nfs_root = \"${CONFIG_18_ROOT}\"\n");
    let outside = tempfile::tempdir().unwrap();
    let config = load(&ws, &[("CONFIG_18_ROOT", outside.path().to_str().unwrap())]).unwrap();
    assert_eq!(config.code_mode.fs_root.unwrap(), outside.path().canonicalize().unwrap());
}

#[test]
fn scripted_sections_inherit_code_mode_limits_and_override_some() {
    let ws = Workspace::new(
        r#"
[code_mode]
timeout = 20
max_calls = 50

[tools.scripted.triage]
description = "Triage Jira issues with search."
tools = ["jira__*", "search"]
timeout = 5
max_concurrent = 1
max_log_lines = 10

[tools.scripted.bare]
description = "Only search."
tools = ["search"]
"#,
    );
    let config = load(&ws, &[]).unwrap();
    let names: Vec<&str> = config.scripted.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["bare", "triage"], "sorted by name");
    let code = config.code_mode.limits.clone();
    assert_eq!((code.timeout, code.max_calls), (Duration::from_secs(20), 50));
    let bare = &config.scripted[0];
    assert_eq!(bare.limits, code, "no override: code_mode's limits, not the defaults");
    let triage: &ScriptedSection = &config.scripted[1];
    assert_eq!(triage.description, "Triage Jira issues with search.");
    assert_eq!(triage.tools, ["jira__*", "search"]);
    assert_eq!(
        triage.limits,
        CodeLimits { timeout: Duration::from_secs(5), max_concurrent: 1, max_log_lines: 10, ..code.clone() }
    );
    let set = triage.tool_set();
    assert!(set.is_match("jira__create_issue") && set.is_match("search") && !set.is_match("get"));
}

#[test]
fn scripted_name_cannot_be_a_builtin() {
    for name in ["search", "get", "sources", "execute", "list_servers", "list_tools", "describe_tool", "search_tools"] {
        let text = problems(&format!("[tools.scripted.{name}]\ndescription = \"d\"\ntools = [\"*\"]\n"));
        assert_has(
            &text,
            &[&format!(
                "tools.scripted.{name} (line 1): '{name}' is a built-in tool's name; built-ins cannot be shadowed, so rename the section"
            )],
        );
    }
    // Names the LLM APIs refuse are refused here too (no dots, at most 64 characters).
    let text = problems(&format!(
        "[tools.scripted.\"a.b\"]\ndescription = \"d\"\ntools = [\"*\"]\n\n[tools.scripted.{}]\ndescription = \"d\"\ntools = [\"*\"]\n",
        "x".repeat(65)
    ));
    assert_has(&text, &["tools.scripted.\"a.b\" (line 1): invalid name", "(line 5): invalid name"]);
}

#[test]
fn an_unset_variable_in_code_mode_is_fatal() {
    // Code mode's permissions are not a section that can be set aside: the config fails.
    let text = problems("[code_mode]\nallow_hosts = [\"${CONFIG_18_UNSET}\"]\n");
    assert_has(&text, &["code_mode.allow_hosts.0 (line 2): environment variable CONFIG_18_UNSET is not set"]);
}

#[test]
fn schema_check_passes_with_both_sections_and_names_a_bad_key() {
    let good = r#"
[code_mode]
timeout = 10
destructive = ["*__delete_*"]
fs_root = "docs"

[tools.scripted.triage]
description = "Triage issues."
tools = ["search", "get"]
max_calls = 20
"#;
    let ws = Workspace::new(good);
    std::fs::create_dir(ws.path().join("docs")).unwrap();
    let run = check(&ws);
    assert!(run.ok().starts_with("ok: ctx.toml is valid"), "{}", run.stdout());

    let ws = Workspace::new(&good.replace("max_calls = 20", "max_calls = 0").replace("fs_root = \"docs\"", ""));
    let run = check(&ws);
    assert_eq!(run.code(), 2, "{}{}", run.stdout(), run.stderr());
    assert_has(
        &run.stderr(),
        &["tools.scripted.triage.max_calls (line 10): expected integer between 1 and 10000, got 0", "has 1 problem(s)"],
    );

    // fs_root is checked after the schema: a missing folder alone fails the check as well.
    let ws = Workspace::new(good);
    let run = check(&ws);
    assert_eq!(run.code(), 2, "{}{}", run.stdout(), run.stderr());
    assert_has(&run.stderr(), &["code_mode.fs_root (line 5): folder \"docs\" does not exist"]);
}
