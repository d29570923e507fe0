//! Tool packs: install from a folder, a local git repository (at a tag or a branch) and a
//! registry (a folder or a git repository); the lock file; `--write` producing sections that run
//! against local stubs of Jira, GitHub and a status page; the load-time refusal of a changed
//! pack; update that shows new hosts before it applies; remove; search; and malicious packs
//! refused without writing anything.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use crate::common::{repo, stub, Run, Workspace, BIN};

/// A pack with one tool that needs no network: `note` answers its `text` parameter.
const NOTE_MANIFEST: &str = r#"
name = "notes"
version = "1.0.0"
description = "Takes notes."
keywords = ["memo"]
hosts = ["notes.example.com"]

[[tools]]
name = "note"
path = "tools/note.lua"
description = "Echo a note"

[config.prefix]
description = "Put before every note"
default = "note:"

[config.api_key]
description = "The notes service's key"
env = "NOTES_KEY"
"#;

const NOTE_LUA: &str = r#"
tool = {
    name = "note",
    description = "Answers the note it is given.",
    parameters = { { name = "text", type = "string", required = true } },
}
function tool.execute(params, context)
    return { note = context.config.prefix .. " " .. params.text }
end
"#;

/// A plain tool outside any pack, to show that a refused pack degrades only itself.
const PLAIN_LUA: &str = r#"
tool = { name = "plain", description = "Says hi.", parameters = {} }
function tool.execute(params, context) return { hi = true } end
"#;

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A folder holding the notes pack.
fn notes_pack() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "pack.toml", NOTE_MANIFEST);
    write(dir.path(), "tools/note.lua", NOTE_LUA);
    dir
}

/// `ctx --config ctx.toml <args>` in the workspace, with extra environment variables.
fn ctx_env(ws: &Workspace, args: &[&str], vars: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.args(["--config", "ctx.toml"]).args(args).current_dir(ws.path());
    cmd.env("CTX_MODEL_DIR", "/nonexistent/ctx-test-model").env_remove("CTX_CONFIG").env_remove("CTX_LOG");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    Run(cmd.output().expect("run ctx"))
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@e")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@e")
        .output()
        .expect("git");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Every file and folder under `dir` with its content's hash (folders and links marked), so a
/// refused install can be shown to have written nothing.
fn tree(dir: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let rel = entry.path().strip_prefix(root).unwrap().display().to_string();
            let kind = entry.file_type().unwrap();
            if kind.is_symlink() {
                out.insert(rel, format!("link {:?}", std::fs::read_link(entry.path()).unwrap()));
            } else if kind.is_dir() {
                out.insert(rel.clone(), "dir".into());
                walk(root, &entry.path(), out);
            } else {
                out.insert(rel, sha256_hex(&std::fs::read(entry.path()).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn lock(ws: &Workspace) -> toml::Table {
    toml::from_str(&std::fs::read_to_string(ws.path().join("ctx.lock")).expect("ctx.lock")).unwrap()
}

fn locked_pack<'a>(lock: &'a toml::Table, name: &str) -> &'a toml::Table {
    lock["pack"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_table().unwrap())
        .find(|p| p["name"].as_str() == Some(name))
        .unwrap()
}

fn shipped_registry() -> String {
    format!("[packs]\nregistry = {:?}\n", repo().join("examples/registry").display().to_string())
}

#[test]
fn install_from_a_folder_copies_the_pack_pins_every_file_and_shows_what_it_asks_for() {
    let pack = notes_pack();
    let ws = Workspace::new("");
    let out = ws.ctx(&["tool", "install", pack.path().to_str().unwrap()]).ok();
    assert!(out.contains("Installed pack notes 1.0.0"), "{out}");
    assert!(out.contains("network:    notes.example.com"), "{out}");
    assert!(out.contains("variables:  NOTES_KEY (config key api_key)"), "{out}");
    // Printed, not written: ctx.toml is as it was.
    assert!(out.contains("[tools.script.note]\npath = \"packs/notes/tools/note.lua\""), "{out}");
    assert_eq!(std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap(), "");
    assert_eq!(std::fs::read_to_string(ws.path().join("packs/notes/tools/note.lua")).unwrap(), NOTE_LUA);
    let lock = lock(&ws);
    let entry = locked_pack(&lock, "notes");
    assert_eq!(entry["kind"].as_str(), Some("path"));
    assert_eq!(entry["folder"].as_str(), Some("packs/notes"));
    let files = entry["files"].as_table().unwrap();
    assert_eq!(files.keys().collect::<Vec<_>>(), ["pack.toml", "tools/note.lua"]);
    assert_eq!(files["tools/note.lua"].as_str().unwrap(), sha256_hex(NOTE_LUA.as_bytes()));
    assert_eq!(files["pack.toml"].as_str().unwrap(), sha256_hex(NOTE_MANIFEST.as_bytes()));
    // No temporary folder is left in the workspace.
    let names: Vec<String> = tree(ws.path()).into_keys().filter(|k| !k.contains('/')).collect();
    assert_eq!(names, ["ctx.lock", "ctx.toml", "packs"]);
    // A second install of the same pack is refused: update is the way.
    let again = ws.ctx(&["tool", "install", pack.path().to_str().unwrap()]);
    assert_eq!(again.code(), 2, "{}", again.stderr());
    assert!(again.stderr().contains("already installed") && again.stderr().contains("ctx tool update notes"));
    let listed = ws.ctx(&["tool", "list", "--installed", "--json"]).json();
    assert_eq!(listed["packs"][0]["name"], "notes");
    assert_eq!(listed["packs"][0]["intact"], true);
}

#[test]
fn install_a_tag_of_a_local_git_repository_pins_its_commit() {
    let repo_dir = tempfile::tempdir().unwrap();
    let r = repo_dir.path();
    git(r, &["init", "-q", "-b", "main"]);
    write(r, "pack.toml", NOTE_MANIFEST);
    write(r, "tools/note.lua", NOTE_LUA);
    git(r, &["add", "."]);
    git(r, &["commit", "-qm", "v1"]);
    git(r, &["tag", "v1"]);
    let v1 = git(r, &["rev-parse", "HEAD"]);
    write(r, "tools/note.lua", &NOTE_LUA.replace("Answers", "Answers (v2)"));
    git(r, &["commit", "-qam", "v2"]);

    let ws = Workspace::new("");
    let source = format!("{}@v1", r.display());
    let out = ws.ctx(&["tool", "install", &source, "--write"]).ok();
    assert!(out.contains(&format!("at v1 (commit {})", &v1[..12])), "{out}");
    let lock = lock(&ws);
    let entry = locked_pack(&lock, "notes");
    assert_eq!(entry["kind"].as_str(), Some("git"));
    assert_eq!(entry["ref"].as_str(), Some("v1"));
    assert_eq!(entry["commit"].as_str(), Some(v1.as_str()));
    assert_eq!(entry["files"]["tools/note.lua"].as_str().unwrap(), sha256_hex(NOTE_LUA.as_bytes()));
    // The tag's content, not the branch's; and no repository came along.
    assert_eq!(std::fs::read_to_string(ws.path().join("packs/notes/tools/note.lua")).unwrap(), NOTE_LUA);
    assert!(!ws.path().join("packs/notes/.git").exists());
    // --write made a section that runs.
    let called =
        ctx_env(&ws, &["tool", "call", "note", "--param", "text=hello", "--json"], &[("NOTES_KEY", "k")]).json();
    assert_eq!(called["result"]["note"], "note: hello");
}

#[test]
fn write_appends_sections_that_run_the_jira_pack_against_a_stub() {
    let (addr, received) = stub(|req| {
        match (req.method.as_str(), req.path.split('?').next().unwrap()) {
        ("GET", "/rest/api/3/search/jql") => (
            200,
            r#"{"issues":[{"key":"ENG-7","fields":{"summary":"Login fails","status":{"name":"Open"},"assignee":null,"updated":"2026-01-02"}}]}"#.into(),
        ),
        ("POST", "/rest/api/3/issue") => (201, r#"{"id":"1","key":"ENG-8"}"#.into()),
        _ => (404, r#"{"errorMessages":["no such route"]}"#.into()),
    }
    });
    let ws = Workspace::new(&shipped_registry());
    let out = ws.ctx(&["tool", "install", "jira", "--write"]).ok();
    assert!(
        out.contains(
            "Added to ctx.toml: [tools.script.jira-search], [tools.script.jira-create], [agents.script.jira-triage]"
        ),
        "{out}"
    );
    assert!(out.contains("network:    *.atlassian.net"), "{out}");
    let config = std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap();
    // What a user with a self-hosted Jira does: point url and allow_hosts at it.
    let config = config
        .replace("allow_hosts = [\"*.atlassian.net\"]", "allow_hosts = [\"127.0.0.1\"]")
        .replace("url = \"\"", &format!("url = \"http://{addr}\""))
        .replace("email = \"\"", "email = \"bot@example.com\"");
    ws.write("ctx.toml", &config);
    let vars = [("JIRA_API_TOKEN", "s3cret")];
    let found = ctx_env(&ws, &["tool", "call", "jira-search", "--param", "jql=text ~ login", "--json"], &vars).json();
    assert_eq!(found["result"]["issues"][0]["key"], "ENG-7");
    assert_eq!(found["result"]["issues"][0]["url"], format!("http://{addr}/browse/ENG-7"));
    let created = ctx_env(&ws, &["tool", "call", "jira-create", "--param", "summary=It broke", "--json"], &vars).json();
    assert_eq!(created["result"]["key"], "ENG-8");
    let requests = received.lock().unwrap().clone();
    let auth = format!("Basic {}", base64_of("bot@example.com:s3cret"));
    assert!(requests.iter().all(|r| r.headers.get("authorization") == Some(&auth)), "{requests:?}");
    let post = requests.iter().find(|r| r.method == "POST").unwrap();
    let body: serde_json::Value = serde_json::from_str(&post.body).unwrap();
    assert_eq!(body["fields"]["project"]["key"], "ENG");
    assert_eq!(body["fields"]["summary"], "It broke");
    // The pack's agent resolves too.
    let prompt =
        ctx_env(&ws, &["agent", "test", "jira-triage", "--arg", "report=login is down", "--json"], &vars).json();
    assert!(prompt["system"].as_str().unwrap().contains("project ENG"), "{prompt}");
    let again = ctx_env(&ws, &["tool", "update", "jira"], &vars).ok();
    assert!(again.contains("up to date"), "{again}");
}

fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

#[test]
fn connector_install_syncs_github_issues_and_statuspage_incidents_from_stubs() {
    let (addr, _) = stub(|req| {
        match req.path.split('?').next().unwrap() {
        "/repos/acme/app/issues" if req.path.contains("page=1") => (
            200,
            r#"[{"number":12,"title":"Checkout times out","body":"The payment step hangs after 30 seconds.","state":"open",
                "labels":[{"name":"bug"}],"user":{"login":"ana"},"html_url":"https://github.com/acme/app/issues/12",
                "created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-02T00:00:00Z"},
               {"number":13,"title":"A pull request","body":"x","state":"open","pull_request":{},"labels":[],
                "user":{"login":"bo"},"html_url":"https://github.com/acme/app/pull/13",
                "created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-02T00:00:00Z"}]"#
                .into(),
        ),
        "/api/v2/summary.json" => (
            200,
            r#"{"page":{"name":"Acme"},"status":{"indicator":"minor","description":"Minor Service Outage"},
                "components":[{"name":"API","status":"degraded_performance"},{"name":"Web","status":"operational"}],
                "incidents":[{"name":"Slow API","status":"investigating","impact":"minor","shortlink":"https://stspg.io/x",
                "incident_updates":[{"body":"We are looking into it."}]}]}"#
                .into(),
        ),
        "/api/v2/incidents.json" => (
            200,
            r#"{"incidents":[{"id":"inc1","name":"Database failover","status":"resolved","impact":"major",
                "shortlink":"https://stspg.io/y","created_at":"2026-01-03T00:00:00Z","updated_at":"2026-01-03T02:00:00Z",
                "components":[{"name":"API"}],
                "incident_updates":[{"status":"resolved","body":"The replica took over.","created_at":"2026-01-03T02:00:00Z"},
                                    {"status":"investigating","body":"Errors on writes.","created_at":"2026-01-03T00:00:00Z"}]}]}"#
                .into(),
        ),
        _ => (200, "[]".into()),
    }
    });
    let ws = Workspace::new(&shipped_registry());
    let out = ws.ctx(&["connector", "install", "github-issues", "--write"]).ok();
    assert!(out.contains("[connectors.script.github-issues]"), "{out}");
    let out = ws.ctx(&["connector", "install", "packs/statuspage", "--write"]).ok();
    assert!(
        out.contains("[tools.script.status-summary]") && out.contains("[connectors.script.status-incidents]"),
        "{out}"
    );
    let config = std::fs::read_to_string(ws.path().join("ctx.toml"))
        .unwrap()
        .replace("allow_hosts = [\"api.github.com\"]", "allow_hosts = [\"127.0.0.1\"]")
        .replace("allow_hosts = [\"*.statuspage.io\"]", "allow_hosts = [\"127.0.0.1\"]")
        .replace("api_url = \"https://api.github.com\"", &format!("api_url = \"http://{addr}\""))
        .replace("repo = \"\"", "repo = \"acme/app\"")
        .replace("page_url = \"\"", &format!("page_url = \"http://{addr}\""));
    ws.write("ctx.toml", &config);
    let vars = [("GITHUB_TOKEN", "gh-token")];
    ctx_env(&ws, &["sync", "script:github-issues"], &vars).ok();
    ctx_env(&ws, &["sync", "script:status-incidents"], &vars).ok();
    let hits = ctx_env(&ws, &["search", "payment hangs", "--json"], &vars).json();
    assert_eq!(hits["results"][0]["title"], "#12 Checkout times out", "{hits}");
    let hits = ctx_env(&ws, &["search", "replica took over", "--json"], &vars).json();
    assert_eq!(hits["results"][0]["title"], "Database failover", "{hits}");
    let pulls = ctx_env(&ws, &["search", "pull request", "--json"], &vars).json();
    assert!(pulls["results"].as_array().unwrap().iter().all(|h| h["title"] != "#13 A pull request"), "{pulls}");
    let status = ctx_env(&ws, &["tool", "call", "status-summary", "--json"], &vars).json();
    assert_eq!(status["result"]["indicator"], "minor");
    assert_eq!(status["result"]["degraded"][0]["name"], "API");
    assert_eq!(status["result"]["incidents"][0]["latest"], "We are looking into it.");
    let listed = ws.ctx(&["agent", "list", "--installed", "--json"]).json();
    let names: Vec<&str> = listed["packs"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["github-issues", "statuspage"]);
}

#[test]
fn a_changed_pack_file_refuses_that_packs_sections_with_the_file_named_and_the_rest_works() {
    let pack = notes_pack();
    let ws = Workspace::new("[tools.script.plain]\npath = \"plain.lua\"\n");
    ws.write("plain.lua", PLAIN_LUA);
    ws.ctx(&["tool", "install", pack.path().to_str().unwrap(), "--write"]).ok();
    let vars = [("NOTES_KEY", "k")];
    ctx_env(&ws, &["tool", "call", "note", "--param", "text=a", "--json"], &vars).json();
    ws.write("packs/notes/tools/note.lua", &NOTE_LUA.replace("params.text", "params.text .. ' (tampered)'"));

    let listed = ctx_env(&ws, &["tool", "list", "--json"], &vars).json();
    let names: Vec<&str> = listed["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"plain") && !names.contains(&"note"), "{names:?}");
    let problem =
        listed["problems"].as_array().unwrap().iter().find(|p| p["name"] == "note").expect("note is reported");
    let message = problem["message"].as_str().unwrap();
    assert!(message.contains("pack 'notes'") && message.contains("tools/note.lua changed since install"), "{message}");
    assert!(message.contains("ctx tool update notes --yes"), "{message}");
    let refused = ctx_env(&ws, &["tool", "call", "note", "--param", "text=a"], &vars);
    assert_eq!(refused.code(), 1, "{}", refused.stdout());
    assert!(refused.stderr().contains("tools/note.lua changed since install"), "{}", refused.stderr());
    ctx_env(&ws, &["tool", "call", "plain", "--json"], &vars).json();
    let check = ctx_env(&ws, &["schema", "check"], &vars);
    assert_eq!(check.code(), 2);
    assert!(
        check.stderr().contains("tools.script.note.path: pack 'notes' (packs/notes) does not match ctx.lock"),
        "{}",
        check.stderr()
    );
    let installed = ws.ctx(&["tool", "list", "--installed"]).ok();
    assert!(installed.contains("MODIFIED: tools/note.lua changed since install"), "{installed}");

    // A file added to the pack is refused as well; update --yes restores the pinned copy.
    ws.write("packs/notes/tools/extra.lua", "return 1");
    let check = ctx_env(&ws, &["schema", "check"], &vars);
    assert!(check.stderr().contains("tools/extra.lua added (not in ctx.lock)"), "{}", check.stderr());
    let out = ws.ctx(&["tool", "update", "notes", "--yes"]).ok();
    assert!(out.contains("differs from ctx.lock"), "{out}");
    let called = ctx_env(&ws, &["tool", "call", "note", "--param", "text=a", "--json"], &vars).json();
    assert_eq!(called["result"]["note"], "note: a");
    assert!(!ws.path().join("packs/notes/tools/extra.lua").exists());

    // A .git folder deeper in the pack hides nothing: its files count like any other.
    ws.write("packs/notes/tools/.git/note.lua", "return 1");
    let check = ctx_env(&ws, &["schema", "check"], &vars);
    assert!(check.stderr().contains("tools/.git/note.lua added (not in ctx.lock)"), "{}", check.stderr());
    std::fs::remove_dir_all(ws.path().join("packs/notes/tools/.git")).unwrap();

    // The check does not fail open: a copy of the pack under another folder, which the lock
    // does not name, is refused; so is every pack when ctx.lock is gone.
    copy_dir(&ws.path().join("packs/notes"), &ws.path().join("packs/copied"));
    let config = std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap();
    ws.write("ctx.toml", &format!("{config}\n[tools.script.copied]\npath = \"packs/copied/tools/note.lua\"\n"));
    let check = ctx_env(&ws, &["schema", "check"], &vars);
    assert!(check.stderr().contains("packs/copied is not a pack ctx.lock pins"), "{}", check.stderr());
    ctx_env(&ws, &["tool", "call", "note", "--param", "text=a", "--json"], &vars).json();
    std::fs::rename(ws.path().join("ctx.lock"), ws.path().join("ctx.lock.away")).unwrap();
    let refused = ctx_env(&ws, &["tool", "call", "note", "--param", "text=a"], &vars);
    assert_eq!(refused.code(), 1, "{}", refused.stdout());
    assert!(refused.stderr().contains("ctx.lock, which is missing"), "{}", refused.stderr());
    ctx_env(&ws, &["tool", "call", "plain", "--json"], &vars).json();
}

#[test]
fn update_shows_a_new_host_and_new_files_and_applies_only_with_yes() {
    let repo_dir = tempfile::tempdir().unwrap();
    let r = repo_dir.path();
    git(r, &["init", "-q", "-b", "main"]);
    write(r, "pack.toml", NOTE_MANIFEST);
    write(r, "tools/note.lua", NOTE_LUA);
    git(r, &["add", "."]);
    git(r, &["commit", "-qm", "v1"]);
    let ws = Workspace::new("");
    ws.ctx(&["tool", "install", &format!("{}@main", r.display()), "--write"]).ok();
    let config_before = std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap();

    write(
        r,
        "pack.toml",
        &NOTE_MANIFEST
            .replace("version = \"1.0.0\"", "version = \"1.1.0\"")
            .replace("hosts = [\"notes.example.com\"]", "hosts = [\"notes.example.com\", \"exfil.example.net\"]"),
    );
    write(r, "tools/helper.lua", "return {}");
    git(r, &["add", "."]);
    git(r, &["commit", "-qm", "v2"]);
    let v2 = git(r, &["rev-parse", "HEAD"]);

    let lock_before = std::fs::read_to_string(ws.path().join("ctx.lock")).unwrap();
    let tree_before = tree(ws.path());
    let shown = ws.ctx(&["tool", "update", "notes"]).ok();
    assert!(shown.contains("Pack notes: 1.0.0 (commit"), "{shown}");
    assert!(shown.contains("NEW host: exfil.example.net"), "{shown}");
    assert!(shown.contains("+ tools/helper.lua") && shown.contains("~ pack.toml"), "{shown}");
    assert!(shown.contains("Nothing was changed. Run `ctx tool update notes --yes` to apply."), "{shown}");
    assert_eq!(std::fs::read_to_string(ws.path().join("ctx.lock")).unwrap(), lock_before);
    assert_eq!(tree(ws.path()), tree_before, "update without --yes wrote something");

    let applied = ws.ctx(&["tool", "update", "notes", "--yes"]).ok();
    assert!(applied.contains("Updated packs/notes/ to 1.1.0"), "{applied}");
    assert!(applied.contains("ctx.toml was not changed") && applied.contains("exfil.example.net"), "{applied}");
    let lock = lock(&ws);
    let entry = locked_pack(&lock, "notes");
    assert_eq!(entry["commit"].as_str(), Some(v2.as_str()));
    assert_eq!(entry["version"].as_str(), Some("1.1.0"));
    assert!(entry["hosts"].as_array().unwrap().iter().any(|h| h.as_str() == Some("exfil.example.net")));
    assert!(ws.path().join("packs/notes/tools/helper.lua").is_file());
    // The sandbox did not widen: the section's allow_hosts is what the user had.
    assert_eq!(std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap(), config_before);
    let called = ctx_env(&ws, &["tool", "call", "note", "--param", "text=b", "--json"], &[("NOTES_KEY", "k")]).json();
    assert_eq!(called["result"]["note"], "note: b");
}

#[test]
fn remove_deletes_the_folder_and_lock_entry_and_names_the_sections_left() {
    let pack = notes_pack();
    let ws = Workspace::new("");
    ws.ctx(&["tool", "install", pack.path().to_str().unwrap(), "--write"]).ok();
    let config = std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap();
    let out = ws.ctx(&["tool", "remove", "notes"]).ok();
    assert!(out.contains("Removed pack notes"), "{out}");
    assert!(out.contains("[tools.script.note]"), "{out}");
    assert!(!ws.path().join("packs").exists());
    assert!(!ws.path().join("ctx.lock").exists());
    assert_eq!(std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap(), config, "remove edits no config");
    let gone = ws.ctx(&["tool", "remove", "notes"]);
    assert_eq!(gone.code(), 2);
    assert!(gone.stderr().contains("no installed pack named 'notes'"), "{}", gone.stderr());
}

#[test]
fn search_matches_names_descriptions_and_keywords_of_a_folder_or_git_registry() {
    let ws = Workspace::new(&shipped_registry());
    let out = ws.ctx(&["tool", "search", "outage"]).ok();
    assert!(out.starts_with("statuspage 1.0.0  [tool, connector]"), "{out}");
    assert!(!out.contains("jira"), "{out}");
    let all = ws.ctx(&["tool", "search", "--json"]).json();
    assert_eq!(all["packs"].as_array().unwrap().len(), 3);
    let none = ws.ctx(&["tool", "search", "kubernetes"]).ok();
    assert!(none.contains("no pack of"), "{none}");

    // The registry as a git repository: cloned, and the install pinned at its commit.
    let registry = tempfile::tempdir().unwrap();
    let r = registry.path();
    copy_dir(&repo().join("examples/registry"), r);
    git(r, &["init", "-q", "-b", "main"]);
    git(r, &["add", "."]);
    git(r, &["commit", "-qm", "registry"]);
    let head = git(r, &["rev-parse", "HEAD"]);
    let ws = Workspace::new(&format!("[packs]\nregistry = \"file://{}\"\n", r.display()));
    let out = ws.ctx(&["agent", "search", "jira", "triage"]).ok();
    assert!(out.starts_with("jira 1.0.0"), "{out}");
    ws.ctx(&["agent", "install", "jira"]).ok();
    let lock = lock(&ws);
    let entry = locked_pack(&lock, "jira");
    assert_eq!(entry["kind"].as_str(), Some("git"));
    assert_eq!(entry["subdir"].as_str(), Some("packs/jira"));
    assert_eq!(entry["commit"].as_str(), Some(head.as_str()));
    let unknown = ws.ctx(&["tool", "install", "nope"]);
    assert_eq!(unknown.code(), 1);
    assert!(unknown.stderr().contains("has no pack \"nope\""), "{}", unknown.stderr());
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Installs `pack` and asserts it is refused with `why` in the message, and that neither the
/// workspace nor the pack's own folder changed.
#[track_caller]
fn refused(pack: &Path, command: &str, why: &str) {
    let ws = Workspace::new("[tools.script.plain]\npath = \"plain.lua\"\n");
    ws.write("plain.lua", PLAIN_LUA);
    let (before, pack_before) = (tree(ws.path()), tree(pack));
    let run = ws.ctx(&[command, "install", pack.to_str().unwrap(), "--write"]);
    assert_ne!(run.code(), 0, "installed:\n{}", run.stdout());
    assert!(run.stderr().contains(why), "expected {why:?} in:\n{}", run.stderr());
    assert_eq!(tree(ws.path()), before, "a refused install wrote into the workspace");
    assert_eq!(tree(pack), pack_before, "a refused install changed the pack's folder");
}

#[test]
fn malicious_packs_are_refused_without_writing_anything() {
    // A script path that climbs out of the pack.
    let pack = notes_pack();
    write(pack.path(), "pack.toml", &NOTE_MANIFEST.replace("tools/note.lua", "../../outside.lua"));
    refused(pack.path(), "tool", "tools.0.path: \"../../outside.lua\" has '..'");
    // An absolute path.
    write(pack.path(), "pack.toml", &NOTE_MANIFEST.replace("tools/note.lua", "/etc/passwd.lua"));
    refused(pack.path(), "connector", "tools.0.path: \"/etc/passwd.lua\" is an absolute path");
    // A name that is not a folder name.
    write(pack.path(), "pack.toml", &NOTE_MANIFEST.replace("name = \"notes\"", "name = \"../evil\""));
    refused(pack.path(), "agent", "fix the pack's manifest");

    // A link out of the pack, where the script should be.
    let pack = notes_pack();
    std::fs::remove_file(pack.path().join("tools/note.lua")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", pack.path().join("tools/note.lua")).unwrap();
    refused(pack.path(), "tool", "tools/note.lua: is a symbolic link (to \"/etc/passwd\")");
    // A link to a folder out of the pack.
    let pack = notes_pack();
    std::os::unix::fs::symlink("/etc", pack.path().join("etc")).unwrap();
    refused(pack.path(), "tool", "refused: etc: is a symbolic link");
    // A manifest that is itself a link.
    let pack = notes_pack();
    let elsewhere = tempfile::tempdir().unwrap();
    write(elsewhere.path(), "pack.toml", NOTE_MANIFEST);
    std::fs::remove_file(pack.path().join("pack.toml")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path().join("pack.toml"), pack.path().join("pack.toml")).unwrap();
    refused(pack.path(), "tool", "refused: pack.toml: is not a regular file");

    // A file over the cap of 1 MiB.
    let pack = notes_pack();
    write(pack.path(), "data/huge.txt", &"x".repeat(1024 * 1024 + 1));
    refused(pack.path(), "tool", "data/huge.txt: is 1048577 bytes, over the cap of 1048576 bytes per file");
    // Too many files.
    let pack = notes_pack();
    for i in 0..300 {
        write(pack.path(), &format!("many/{i}.txt"), "x");
    }
    refused(pack.path(), "tool", "the pack has more than 256 files");
    // A pack that is under each cap file by file but over the cap in all.
    let pack = notes_pack();
    for i in 0..17 {
        write(pack.path(), &format!("big/{i}.bin"), &"y".repeat(1024 * 1024));
    }
    refused(pack.path(), "tool", "the cap per pack");
}

/// The shipped registry's index agrees with its packs' manifests, which all validate (the walk
/// of checked-in configs leaves pack.toml files to this test).
#[test]
fn the_shipped_registry_index_matches_valid_pack_manifests() {
    let root = repo().join("examples/registry");
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("index.json")).unwrap()).unwrap();
    let entries = index["packs"].as_array().unwrap();
    assert_eq!(entries.len(), 3);
    for entry in entries {
        let dir = root.join(entry["path"].as_str().unwrap());
        let manifest = ctx::packs::Manifest::read(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        assert_eq!(entry["name"].as_str(), Some(manifest.name()));
        assert_eq!(entry["version"].as_str(), Some(manifest.version()));
        assert_eq!(entry["description"].as_str(), Some(manifest.spec.description.as_str()));
        for (_, script) in manifest.scripts() {
            assert!(dir.join(script.path.as_str()).is_file(), "{}: {}", manifest.name(), script.path.as_str());
        }
    }
}
