//! The sources' lifecycle and quiet output, through the real binary on real folders:
//! `ctx sources prune`, the shrink guard of sync, skip counts, progress and colour, broken pipes.

use std::io::Read;
use std::process::{Command, Stdio};

use crate::common::{Run, Workspace, BIN};

const DOCS: &str = "[connectors.filesystem.docs]\nroot = \"docs\"\n";

/// `ctx --config ctx.toml <args>` in `ws` with extra environment variables, none inherited
/// that would change its output.
fn ctx_command(ws: &Workspace, env: &[(&str, &str)], args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(["--config", "ctx.toml"])
        .args(args)
        .current_dir(ws.path())
        .env("CTX_MODEL_DIR", "/nonexistent/ctx-test-model")
        .env_remove("CTX_CONFIG")
        .env_remove("CTX_LOG")
        .env_remove("NO_COLOR");
    for (k, v) in env {
        command.env(k, v);
    }
    command
}

/// Runs `ctx --config ctx.toml <args>` in `ws` with extra environment variables.
fn ctx_env(ws: &Workspace, env: &[(&str, &str)], args: &[&str]) -> Run {
    Run(ctx_command(ws, env, args).output().expect("run ctx"))
}

fn count(ws: &Workspace, sql: &str) -> i64 {
    ws.db().query_row(sql, [], |r| r.get(0)).unwrap()
}

fn docs_of(ws: &Workspace, source: &str) -> i64 {
    ws.db().query_row("SELECT COUNT(*) FROM documents WHERE source = ?1", [source], |r| r.get(0)).unwrap()
}

fn hits(ws: &Workspace, query: &str) -> usize {
    ws.ctx(&["search", query, "--json"]).json()["results"].as_array().unwrap().len()
}

/// The one JSON summary line of a single-source `ctx sync --json`, whatever its exit code.
fn sync_json(ws: &Workspace, args: &[&str]) -> (i32, serde_json::Value) {
    let run = ws.ctx(&[&["sync", "--json"], args].concat());
    let line =
        run.stdout().lines().next().unwrap_or_else(|| panic!("no summary; stderr: {}", run.stderr())).to_string();
    (run.code(), serde_json::from_str(&line).unwrap())
}

fn integrity_ok(ws: &Workspace) {
    ws.db().execute("INSERT INTO chunks_fts(chunks_fts) VALUES('integrity-check')", []).unwrap();
    let check: String = ws.db().query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(check, "ok");
}

#[test]
fn a_renamed_source_is_listed_and_pruned() {
    let ws = Workspace::new(DOCS);
    ws.write("docs/walrus.md", "# Walrus\n\nThe walrus guards the deploy pipeline.\n");
    ws.write("docs/rota.md", "# Rota\n\nPenguins run the incident rota.\n");
    ws.ctx(&["sync"]).ok();
    // A vector of the old source's chunks goes with them.
    let db = ws.db();
    db.execute("INSERT INTO embedding_models (id, name, dims) VALUES (1, 'test', 1)", []).unwrap();
    db.execute("INSERT INTO chunk_vectors (chunk_id, model_id, vector) SELECT id, 1, x'0000803f' FROM chunks", [])
        .unwrap();
    drop(db);

    std::fs::write(ws.path().join("ctx.toml"), "[connectors.filesystem.handbook]\nroot = \"docs\"\n").unwrap();
    ws.ctx(&["sync"]).ok();
    assert_eq!(hits(&ws, "walrus"), 2, "the old source doubles every result");

    let listing = ws.ctx(&["sources"]).ok();
    assert!(listing.contains("filesystem:docs"), "{listing}");
    assert!(listing.contains("no longer configured") && listing.contains("run `ctx sources prune`"), "{listing}");
    let json = ws.ctx(&["sources", "--json"]).json();
    let old = json["sources"].as_array().unwrap().iter().find(|s| s["name"] == "filesystem:docs").unwrap().clone();
    assert_eq!((old["configured"].as_bool(), old["documents"].as_u64()), (Some(false), Some(2)), "{json}");

    let dry = ws.ctx(&["sources", "prune", "--dry-run"]).ok();
    assert!(dry.contains("would delete 1 source(s)"), "{dry}");
    assert!(dry.contains("filesystem:docs: 2 document(s), 2 chunk(s)"), "{dry}");
    assert!(!dry.contains("handbook"), "{dry}");
    assert_eq!(docs_of(&ws, "filesystem:docs"), 2, "a dry run deletes nothing");
    let dry_json = ws.ctx(&["sources", "prune", "--dry-run", "--json"]).json();
    assert_eq!(
        dry_json,
        serde_json::json!({"dry_run": true, "sources": [{"source": "filesystem:docs", "documents": 2, "chunks": 2}]})
    );

    let generation = count(&ws, "SELECT value FROM store_meta WHERE key = 'generation'");
    let pruned = ws.ctx(&["sources", "prune"]).ok();
    assert!(pruned.contains("filesystem:docs: 2 document(s), 2 chunk(s)"), "said first: {pruned}");
    assert!(pruned.contains("deleted filesystem:docs: 2 document(s), 2 chunk(s)"), "{pruned}");
    assert_eq!(docs_of(&ws, "filesystem:docs"), 0);
    assert_eq!(count(&ws, "SELECT COUNT(*) FROM chunks WHERE source = 'filesystem:docs'"), 0);
    assert_eq!(count(&ws, "SELECT COUNT(*) FROM sync_state WHERE source = 'filesystem:docs'"), 0);
    assert_eq!(count(&ws, "SELECT COUNT(*) FROM chunk_vectors"), 0, "vectors cascade with their chunks");
    assert!(count(&ws, "SELECT value FROM store_meta WHERE key = 'generation'") > generation, "readers see it");
    integrity_ok(&ws);
    assert_eq!(hits(&ws, "walrus"), 1, "no more doubles");
    assert_eq!(docs_of(&ws, "filesystem:handbook"), 2, "the configured source is untouched");
    assert!(!ws.ctx(&["sources"]).ok().contains("filesystem:docs"));

    let again = ws.ctx(&["sources", "prune"]).ok();
    assert!(again.contains("nothing to prune"), "{again}");
}

/// Each source is deleted in its own transaction: a prune killed half-way leaves every source
/// whole or gone, never half of one, and the next prune finishes the job.
#[test]
fn a_prune_killed_half_way_leaves_each_source_whole_or_gone() {
    const PER_SOURCE: i64 = 1500;
    let names = ["one", "two", "three"];
    let config: String = names.iter().map(|n| format!("[connectors.filesystem.{n}]\nroot = \"docs\"\n")).collect();
    let ws = Workspace::new(&config);
    for i in 0..PER_SOURCE {
        ws.write(&format!("docs/d{i}.md"), &format!("# Note {i}\n\nquokka {i} and the rota\n"));
    }
    ws.ctx(&["sync"]).ok();
    std::fs::write(ws.path().join("ctx.toml"), "").unwrap();

    let mut child = Command::new(BIN)
        .args(["--config", "ctx.toml", "sources", "prune"])
        .current_dir(ws.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed as soon as the first deletion is visible: the next source is being deleted then
    // (and a prune that deleted in pieces would be caught half-way through its first).
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(60) && child.try_wait().unwrap().is_none() {
        if count(&ws, "SELECT COUNT(*) FROM documents") < PER_SOURCE * names.len() as i64 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    child.kill().ok();
    child.wait().unwrap();

    for n in names {
        let source = format!("filesystem:{n}");
        let docs = docs_of(&ws, &source);
        let chunks: i64 =
            ws.db().query_row("SELECT COUNT(*) FROM chunks WHERE source = ?1", [&source], |r| r.get(0)).unwrap();
        let synced: i64 =
            ws.db().query_row("SELECT COUNT(*) FROM sync_state WHERE source = ?1", [&source], |r| r.get(0)).unwrap();
        let whole = (PER_SOURCE, PER_SOURCE, 1);
        assert!((docs, chunks, synced) == whole || (docs, chunks, synced) == (0, 0, 0), "{source}: {docs} {chunks}");
    }
    integrity_ok(&ws);
    ws.ctx(&["sources", "prune"]).ok();
    assert_eq!(count(&ws, "SELECT COUNT(*) FROM documents"), 0);
    integrity_ok(&ws);
}

#[test]
fn an_emptied_folder_is_refused_then_allowed() {
    let ws = Workspace::new(DOCS);
    for name in ["a", "b", "c"] {
        ws.write(&format!("docs/{name}.md"), &format!("# {name}\n\nwombat {name}\n"));
    }
    ws.ctx(&["sync"]).ok();
    for name in ["a", "b", "c"] {
        std::fs::remove_file(ws.path().join(format!("docs/{name}.md"))).unwrap();
    }

    for args in [&["sync"][..], &["sync", "--dry-run"]] {
        let refused = ws.ctx(args);
        assert_eq!(refused.code(), 1, "{args:?}: {}", refused.stdout());
        let err = refused.stderr();
        assert!(
            err.contains("filesystem:docs: the scan returned none of the 3 document(s) this source holds"),
            "{err}"
        );
        assert!(err.contains("run `ctx sync filesystem:docs --allow-shrink`"), "{err}");
        assert!(err.contains("set `allow_shrink = true` in [connectors.filesystem.docs]"), "{err}");
        assert!(refused.stdout().contains("0 deleted"), "{}", refused.stdout());
        assert_eq!(docs_of(&ws, "filesystem:docs"), 3, "{args:?} deleted nothing");
    }
    assert_eq!(hits(&ws, "wombat"), 3);
    let sources = ws.ctx(&["sources"]).ok();
    assert!(sources.contains("FAILING") && sources.contains("--allow-shrink"), "{sources}");

    let (code, s) = sync_json(&ws, &["--allow-shrink"]);
    assert_eq!((code, s["deleted"].as_u64(), s["error"].is_null()), (0, Some(3), true), "{s}");
    assert_eq!(docs_of(&ws, "filesystem:docs"), 0);

    // The same through the source's own setting.
    ws.write("docs/a.md", "# a\n\nwombat\n");
    ws.ctx(&["sync"]).ok();
    std::fs::remove_file(ws.path().join("docs/a.md")).unwrap();
    assert_eq!(ws.ctx(&["sync"]).code(), 1);
    std::fs::write(ws.path().join("ctx.toml"), format!("{DOCS}allow_shrink = true\n")).unwrap();
    let (code, s) = sync_json(&ws, &[]);
    assert_eq!((code, s["deleted"].as_u64()), (0, Some(1)), "{s}");
}

#[test]
fn a_scan_that_finds_under_half_deletes_nothing_but_writes_what_it_found() {
    let ws = Workspace::new(DOCS);
    for i in 0..10 {
        ws.write(&format!("docs/d{i}.md"), &format!("# d{i}\n\nbandicoot {i}\n"));
    }
    ws.ctx(&["sync"]).ok();
    for i in 0..6 {
        std::fs::remove_file(ws.path().join(format!("docs/d{i}.md"))).unwrap();
    }
    ws.write("docs/new.md", "# New\n\nquokka arrives\n");
    let (code, s) = sync_json(&ws, &[]);
    assert_eq!(code, 1);
    let err = s["error"].as_str().unwrap();
    assert!(err.contains("the scan found only 4 of the 10 documents this source holds"), "{err}");
    assert!(err.contains("not deleting the other 6"), "{err}");
    assert_eq!((s["added"].as_u64(), s["deleted"].as_u64()), (Some(1), Some(0)), "{s}");
    assert_eq!(hits(&ws, "bandicoot"), 10, "nothing deleted");
    assert_eq!(hits(&ws, "quokka"), 1, "a batched source still writes what it found");

    // Exactly half is kept: allowed.
    ws.write("docs/d0.md", "# d0\n\nbandicoot 0\n");
    let (code, s) = sync_json(&ws, &[]);
    assert_eq!((code, s["deleted"].as_u64()), (0, Some(5)), "{s}");
}

/// A script that returns every item (a full scan) is guarded like a folder; one that returns
/// `{items, deleted}` names its deletions and is not. A refused script sync writes nothing at
/// all, not even its saved state.
#[test]
fn a_script_returning_nothing_is_refused_then_allowed() {
    let section = "[connectors.script.tickets]\npath = \"tickets.lua\"\n";
    let ws = Workspace::new(section);
    ws.write(
        "tickets.lua",
        r#"
local ext = { name = "tickets" }
function ext.scan(config, context)
  local list = json.parse(fs.read("tickets.json"))
  context.state.set("runs", (context.state.get("runs") or 0) + 1)
  if list.incremental then return { items = {}, deleted = {} } end
  local items = {}
  for _, t in ipairs(list) do
    items[#items + 1] = { source_id = t, title = "Ticket " .. t, body = "gerbil " .. t, updated_at = 0 }
  end
  return items
end
return ext
"#,
    );
    ws.write("tickets.json", r#"["1", "2", "3"]"#);
    ws.ctx(&["sync"]).ok();
    let runs = || count(&ws, "SELECT json_extract(state_json, '$.runs') FROM connector_state");
    assert_eq!(runs(), 1);

    ws.write("tickets.json", "[]");
    let refused = ws.ctx(&["sync"]);
    assert_eq!(refused.code(), 1);
    let err = refused.stderr();
    assert!(err.contains("script:tickets: the scan returned none of the 3 document(s)"), "{err}");
    assert!(err.contains("`ctx sync script:tickets --allow-shrink`"), "{err}");
    assert!(err.contains("[connectors.script.tickets]"), "{err}");
    assert_eq!(hits(&ws, "gerbil"), 3);
    assert_eq!(runs(), 1, "the state of a refused scan is not saved");

    // An incremental scan that deletes nothing is not a shrink.
    ws.write("tickets.json", r#"{"incremental": true}"#);
    ws.ctx(&["sync"]).ok();
    assert_eq!((hits(&ws, "gerbil"), runs()), (3, 2));

    ws.write("tickets.json", "[]");
    let (code, s) = sync_json(&ws, &["--allow-shrink"]);
    assert_eq!((code, s["deleted"].as_u64()), (0, Some(3)), "{s}");
    assert_eq!((hits(&ws, "gerbil"), runs()), (0, 3));

    ws.write("tickets.json", r#"["4"]"#);
    ws.ctx(&["sync"]).ok();
    ws.write("tickets.json", "[]");
    assert_eq!(ws.ctx(&["sync"]).code(), 1);
    std::fs::write(ws.path().join("ctx.toml"), format!("{section}allow_shrink = true\n")).unwrap();
    let (code, s) = sync_json(&ws, &[]);
    assert_eq!((code, s["deleted"].as_u64()), (0, Some(1)), "{s}");
}

#[test]
fn skips_are_one_line_of_counts_and_v_lists_them() {
    let ws = Workspace::new("[connectors.filesystem.docs]\nroot = \"docs\"\nmax_file_bytes = 1000\n");
    ws.write("docs/good.md", "# Good\n\nfine\n");
    ws.write("docs/big.md", &"x".repeat(5000));
    for i in 0..3 {
        std::fs::write(ws.path().join(format!("docs/blob{i}.png")), b"\x89PNG\0\0").unwrap();
    }
    std::os::unix::fs::symlink("missing-target.md", ws.path().join("docs/dangling.md")).unwrap();

    for round in ["first", "unchanged"] {
        let run = ws.ctx(&["sync"]);
        let out = run.ok();
        let line = "  skipped 3 binary files, 1 over max_file_bytes, 1 unreadable entry (-v lists them)\n";
        assert!(out.contains(line), "{round}: {out}");
        assert!(!run.stderr().contains("blob"), "{round}: no line per file: {}", run.stderr());
    }
    let (_, s) = sync_json(&ws, &[]);
    assert_eq!(s["skipped"], 5);
    assert_eq!(s["skipped_by_reason"], serde_json::json!({"binary": 3, "too_large": 1, "unreadable": 1}));

    let run = ws.ctx(&["sync", "-v"]);
    let out = run.ok();
    assert!(out.contains("  skipped 3 binary files, 1 over max_file_bytes, 1 unreadable entry\n"), "{out}");
    let err = run.stderr();
    for i in 0..3 {
        assert!(err.contains(&format!("skipped blob{i}.png (filesystem:docs): binary file")), "{err}");
    }
    assert!(err.contains("skipped big.md (filesystem:docs): 5000 bytes is over the 1000-byte limit"), "{err}");
    assert!(err.contains("skipped dangling.md (filesystem:docs): unreadable: broken symlink"), "{err}");
    let quiet = ws.ctx(&["sync", "-q"]).ok();
    assert!(quiet.is_empty(), "{quiet}");
}

/// A section an unset variable disables: every command warns about it, a log line to look at.
const WARNS: &str = "[tools.script.t]\npath = \"t.lua\"\ntoken = \"${CTX_LIFECYCLE_20_UNSET}\"\n";

#[test]
fn no_progress_or_colour_when_stderr_is_not_a_terminal() {
    let ws = Workspace::new(&format!("{DOCS}{WARNS}"));
    for i in 0..50 {
        ws.write(&format!("docs/d{i}.md"), &format!("# d{i}\n\nnumbat {i}\n"));
    }
    for env in [&[][..], &[("NO_COLOR", "1")]] {
        for args in [&["sync"][..], &["sync", "--full"]] {
            let run = ctx_env(&ws, env, args);
            run.ok();
            let err = run.stderr();
            assert!(err.contains("WARN") && err.contains("CTX_LIFECYCLE_20_UNSET"), "a warning to look at: {err}");
            assert!(!err.contains('\x1b'), "{env:?} {args:?}: escape codes in {err:?}");
            assert!(!err.contains('\r') && !err.contains("items"), "{env:?} {args:?}: a progress line in {err:?}");
        }
    }
}

/// Output of `ctx <args>` with stderr on a pseudo-terminal, as a person at a terminal sees it.
fn on_a_terminal(ws: &Workspace, env: &[(&str, &str)], args: &[&str]) -> String {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::fs::OpenOptionsExt;
    // SAFETY: plain libc calls on a descriptor this function owns; ptsname_r writes into `name`.
    let (master, slave) = unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(master >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        let master = OwnedFd::from_raw_fd(master);
        use std::os::fd::AsRawFd;
        assert_eq!(libc::grantpt(master.as_raw_fd()), 0);
        assert_eq!(libc::unlockpt(master.as_raw_fd()), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()), 0);
        let name = std::ffi::CStr::from_ptr(name.as_ptr()).to_str().unwrap().to_string();
        let slave = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOCTTY).open(name).unwrap();
        (std::fs::File::from(master), slave)
    };
    // The parent's copy of the terminal's far end closes with the command, a temporary dropped
    // at the end of this statement: once the child exits, reading the master ends (EIO) after
    // what it wrote.
    let mut child = ctx_command(ws, env, args).stdout(Stdio::null()).stderr(Stdio::from(slave)).spawn().unwrap();
    let mut master = master;
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&seen).into_owned()
    });
    child.wait().unwrap();
    reader.join().unwrap()
}

/// On a terminal, log lines have colour, unless NO_COLOR is set (and not empty).
#[test]
fn no_colour_with_no_color_on_a_terminal() {
    let ws = Workspace::new(WARNS);
    let colour = |text: &str| text.contains("\x1b[") && text.contains('m');
    let plain = on_a_terminal(&ws, &[], &["sources"]);
    assert!(plain.contains("CTX_LIFECYCLE_20_UNSET") && colour(&plain), "{plain:?}");
    let empty = on_a_terminal(&ws, &[("NO_COLOR", "")], &["sources"]);
    assert!(colour(&empty), "an empty NO_COLOR is unset: {empty:?}");
    let off = on_a_terminal(&ws, &[("NO_COLOR", "1")], &["sources"]);
    assert!(off.contains("CTX_LIFECYCLE_20_UNSET") && !off.contains('\x1b'), "{off:?}");
}

/// On a terminal, a re-sync shows done/total, a whole-number rate and the elapsed time, and the
/// line is erased when the source ends.
#[test]
fn progress_shows_total_rate_and_time_and_clears_itself() {
    let ws = Workspace::new(DOCS);
    for i in 0..300 {
        ws.write(&format!("docs/d{i}.md"), &format!("# d{i}\n\nnumbat {i}\n"));
    }
    ws.ctx(&["sync"]).ok();
    let seen = on_a_terminal(&ws, &[("NO_COLOR", "1")], &["sync", "--full"]);
    let frame = seen.split('\r').find(|f| f.contains("/300 items")).unwrap_or_else(|| panic!("{seen:?}"));
    assert!(frame.contains("filesystem:docs: ["), "{frame:?}");
    let rate = frame.split(", ").nth(1).unwrap_or_default();
    assert!(
        rate.ends_with("/s") && rate[..rate.len() - 2].chars().all(|c| c.is_ascii_digit() || c == ','),
        "{frame:?}"
    );
    assert!(frame.split(", ").nth(2).is_some_and(|t| t.trim_start().starts_with(|c: char| c.is_ascii_digit())));
    // Everything the bar drew is erased: after its last frame comes an erase of the line.
    let last = seen.rfind("items").unwrap();
    assert!(seen[last..].contains("\x1b[2K"), "{:?}", &seen[last..]);
}

/// `| head -1`: the reader goes away, the command ends quietly with status 0.
#[test]
fn a_closed_stdout_ends_quietly_with_status_0() {
    let ws = Workspace::new(DOCS);
    ws.write("docs/walrus.md", "# Walrus\n\nThe walrus guards the deploy pipeline.\n");
    // Bigger than any pipe buffer, so the reader's going away is seen by a write.
    let mut big = String::from("# Big\n\n");
    while big.len() < 1_500_000 {
        big.push_str("capybara line of a long document\n");
    }
    ws.write("docs/big.md", &big);
    ws.ctx(&["sync"]).ok();
    let id = ws.ctx(&["search", "capybara", "--json"]).json()["results"][0]["id"].as_str().unwrap().to_string();

    let quiet = |args: &[&str], stdout: Stdio| {
        let mut child = Command::new(BIN)
            .args(["--config", "ctx.toml"])
            .args(args)
            .current_dir(ws.path())
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take();
        if let Some(out) = &mut out {
            let mut byte = [0u8; 1];
            out.read_exact(&mut byte).unwrap();
        }
        drop(out);
        let output = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
    };
    // Read one byte, then go away, as `head -c1` does.
    quiet(&["get", &id, "--json"], Stdio::piped());
    quiet(&["get", &id], Stdio::piped());
    // A reader gone before the first write.
    for args in [
        &["search", "walrus", "--json"][..],
        &["search", "walrus"],
        &["sources"],
        &["sources", "--json"],
        &["sources", "prune", "--dry-run"],
        &["stats"],
        &["sync"],
        &["completions", "bash"],
        &["tool", "list"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        quiet(args, Stdio::from(writer));
    }
}

/// `ctx sync docs` names a source the way `--source docs` does: by its bare name.
#[test]
fn sync_takes_a_bare_source_name() {
    let ws = Workspace::new(
        "[connectors.filesystem.docs]\nroot = \"docs\"\n\n[connectors.filesystem.code]\nroot = \"code\"\n",
    );
    ws.write("docs/a.md", "# A\n\nThe quokka page.\n");
    ws.write("code/b.md", "# B\n\nThe numbat page.\n");
    let out = ws.ctx(&["sync", "code"]).ok();
    assert!(out.contains("synced filesystem:code: 1 added"), "{out}");
    assert!(!out.contains("filesystem:docs"), "{out}");
    let run = ws.ctx(&["sync", "nosuch"]);
    assert_eq!(run.code(), 2, "{}", run.stderr());
    assert!(run.stderr().contains("filesystem:code, filesystem:docs"), "{}", run.stderr());
}
