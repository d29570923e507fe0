//! The upstream runtime: `ctx::upstream::Upstreams` driven directly against the
//! fault-injecting upstream (stdio, through the real ctx guard) and against a real `ctx serve`
//! over Streamable HTTP. Supervision, restarts, crash loops, deadlines, cancellation, progress,
//! `list_changed`, the child's environment, hot reload and process cleanup.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctx::config::upstream::{Expose, UpstreamSection, UpstreamTransport};
use ctx::upstream::{Event, State, Status, Tuning, UpstreamError, Upstreams};
use serde_json::{json, Map, Value};

use crate::common::{ServeChild, Workspace, BIN};

/// Generous bound on anything the tests wait for: they assert behaviour, not speed.
const WAIT: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Short timings, and the real ctx binary as the guard (the production path).
fn tuning() -> Tuning {
    Tuning {
        connect_timeout: Duration::from_secs(10),
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(200),
        crash_loop_failures: 1000,
        crash_loop_window: Duration::from_secs(60),
        crash_loop_retry: Duration::from_secs(60),
        stop_grace: Duration::from_secs(2),
        list_debounce: Duration::from_millis(100),
        ping_interval: Duration::from_secs(15),
        guard: Some(PathBuf::from(BIN)),
    }
}

fn fault(name: &str, args: &[&str]) -> UpstreamSection {
    UpstreamSection {
        name: name.to_string(),
        transport: UpstreamTransport::Stdio {
            command: crate::fault_upstream::binary().display().to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: BTreeMap::new(),
            cwd: None,
        },
        tools: Vec::new(),
        exclude: Vec::new(),
        timeout: Duration::from_secs(60),
        required: false,
        enabled: true,
        expose: Expose::All,
        origin: "ctx.toml".to_string(),
    }
}

type Events = Arc<Mutex<Vec<Event>>>;

fn start(sections: &[UpstreamSection], tuning: Tuning) -> (Arc<Upstreams>, Events) {
    let events: Events = Arc::default();
    let sink = events.clone();
    let upstreams = Upstreams::start_with(sections, Arc::new(move |e| sink.lock().unwrap().push(e)), tuning);
    (upstreams, events)
}

fn status(u: &Upstreams, name: &str) -> Status {
    u.status().into_iter().find(|s| s.name == name).expect("a status for the server")
}

async fn until<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn ready(u: &Upstreams, name: &str) -> Status {
    until(&format!("{name} ready"), || Some(status(u, name)).filter(|s| s.state == State::Ready)).await
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
}

fn args(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

fn tool_names(u: &Upstreams, name: &str) -> Vec<String> {
    let catalog = u.catalog().into_iter().find(|c| c.name == name).unwrap();
    catalog.tools.iter().map(|t| t["name"].as_str().unwrap().to_string()).collect()
}

/// Alive and not a zombie.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().chars().next()).unwrap_or(None);
            !matches!(state, Some('Z') | Some('X'))
        }
        Err(_) => false,
    }
}

fn pids(line: &str) -> Vec<i32> {
    line.split_whitespace().map(|p| p.parse().unwrap()).collect()
}

#[test]
fn connects_lists_filters_and_calls() {
    let rt = runtime();
    rt.block_on(async {
        let mut section = fault("fault", &["--resources"]);
        section.exclude = vec!["hu*".to_string()];
        let started = Instant::now();
        let (u, events) = start(&[section], tuning());
        assert_eq!(status(&u, "fault").state, State::Connecting, "start returns before the connection");
        let st = ready(&u, "fault").await;
        println!("connect + list through the guard: {:?}", started.elapsed());
        assert!(st.pid.is_some() && st.tools > 5, "{st:?}");
        let names = tool_names(&u, "fault");
        assert!(names.contains(&"echo".to_string()) && names.contains(&"crash".to_string()), "{names:?}");
        assert!(!names.contains(&"huge".to_string()), "excluded by the section's glob: {names:?}");
        let catalog = u.catalog().into_iter().next().unwrap();
        assert!(catalog.has_resources && catalog.resources.len() == 2, "{:?}", catalog.resources);
        assert_eq!(catalog.resource_templates.len(), 1);
        assert!(catalog.prompts.iter().any(|p| p["name"] == "greet"));
        let echo = catalog.tools.iter().find(|t| t["name"] == "echo").unwrap();
        assert!(echo.contains_key("inputSchema") && echo.contains_key("outputSchema"), "{echo:?}");
        assert!(events.lock().unwrap().iter().any(|e| e.server == "fault" && e.tools));

        let result = u.call_tool("fault", "echo", args(json!({"text": "hi"})), None).await.unwrap();
        assert_eq!(result["structuredContent"], json!({"text": "hi"}), "{result:?}");
        let failed = u.call_tool("fault", "fail", args(json!({"message": "nope"})), None).await.unwrap();
        assert_eq!(failed["isError"], true, "a tool error is a result, not an UpstreamError");
        let read = u.read_resource("fault", "fault://doc/7").await.unwrap();
        assert!(read["contents"][0]["uri"] == "fault://doc/7", "{read:?}");
        let prompt = u.get_prompt("fault", "greet", args(json!({"name": "Ada"}))).await.unwrap();
        assert!(prompt["messages"].to_string().contains("Hello, Ada"), "{prompt:?}");
        let unknown = u.call_tool("fault", "no_such_tool", Map::new(), None).await;
        assert!(matches!(unknown, Err(UpstreamError::Rpc { .. })), "a JSON-RPC error from the upstream: {unknown:?}");
        assert!(matches!(u.call_tool("nope", "echo", Map::new(), None).await, Err(UpstreamError::UnknownServer(_))));

        let st = status(&u, "fault");
        assert!(st.calls >= 5 && st.latency_p50_ms.is_some(), "{st:?}");
        u.shutdown().await;
    });
}

#[test]
fn crash_is_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let rt = runtime();
    rt.block_on(async {
        let (u, _) = start(&[fault("fault", &["--starts", starts.to_str().unwrap()])], tuning());
        let before = ready(&u, "fault").await;
        let crashed = u.call_tool("fault", "crash", Map::new(), None).await;
        assert!(
            matches!(crashed, Err(UpstreamError::Disconnected { .. }) | Err(UpstreamError::Down { .. })),
            "{crashed:?}"
        );
        let after = until("a second start, ready", || {
            let s = status(&u, "fault");
            (s.state == State::Ready && lines(&starts).len() == 2).then_some(s)
        })
        .await;
        let recorded = lines(&starts);
        assert_ne!(recorded[0], recorded[1], "a new process");
        assert_eq!(after.pid, Some(pids(&recorded[1])[0] as u32), "status shows the server's own pid");
        assert_ne!(before.pid, after.pid);
        assert!(after.restarts >= 1 && after.attempt == 0, "{after:?}");
        assert!(after.last_error.as_deref().unwrap_or("").contains("status 1"), "{after:?}");
        let echo = u.call_tool("fault", "echo", args(json!({"text": "back"})), None).await.unwrap();
        assert_eq!(echo["structuredContent"]["text"], "back");
        u.shutdown().await;
    });
}

#[test]
fn exit_at_start_is_a_crash_loop_and_calls_fail_at_once() {
    let rt = runtime();
    rt.block_on(async {
        let mut section = fault("dead", &["--exit-at-start"]);
        section.required = true;
        section.timeout = Duration::from_secs(60);
        let mut t = tuning();
        t.crash_loop_failures = 3;
        let (u, _) = start(&[section], t);
        let refused = u.required_ready(WAIT).await.unwrap_err();
        assert!(refused.contains("'dead'") && refused.contains("status 3"), "{refused}");
        let st = until("crash-looping", || Some(status(&u, "dead")).filter(|s| s.state == State::CrashLooping)).await;
        assert!(st.attempt >= 3 && st.restarts >= 2 && st.pid.is_none(), "{st:?}");
        let asked = Instant::now();
        let down = u.call_tool("dead", "echo", args(json!({"text": "x"})), None).await.unwrap_err();
        assert!(asked.elapsed() < Duration::from_secs(10), "failed at once, not after the 60 s timeout");
        match &down {
            UpstreamError::Down { state, attempt, last_error, .. } => {
                assert_eq!(*state, State::CrashLooping);
                assert!(*attempt >= 3);
                assert!(last_error.as_deref().unwrap().contains("before it answered initialize"), "{down}");
            }
            other => panic!("expected Down, got {other:?}"),
        }
        let message = down.to_string();
        assert!(message.contains("crash-looping after") && message.contains("failed attempts"), "{message}");
        assert!(message.contains("status 3"), "{message}");
        u.shutdown().await;
    });
}

/// A down server's message counts its attempts as a person would: none is "attempt 0".
#[test]
fn a_down_servers_message_counts_attempts_naturally() {
    let down = |state, attempt| {
        UpstreamError::Down { server: "time".into(), state, attempt, last_error: Some("exit status 1".into()) }
            .to_string()
    };
    assert_eq!(
        down(State::Restarting, 0),
        "upstream MCP server 'time' is restarting after a lost connection; last error: exit status 1"
    );
    assert_eq!(
        down(State::Restarting, 1),
        "upstream MCP server 'time' is restarting after 1 failed attempt; last error: exit status 1"
    );
    assert!(down(State::Restarting, 2).contains("restarting after 2 failed attempts;"));
    assert!(down(State::Connecting, 3).contains("is connecting, attempt 3;"));
    assert!(down(State::CrashLooping, 5).contains("is crash-looping after 5 failed attempts;"));
    for state in [State::Connecting, State::Restarting, State::CrashLooping] {
        assert!(!down(state, 0).contains("attempt 0"), "{}", down(state, 0));
    }
}

#[test]
fn hang_at_initialize_is_bounded_by_the_connect_timeout() {
    let rt = runtime();
    rt.block_on(async {
        let mut t = tuning();
        t.connect_timeout = Duration::from_millis(500);
        let (u, _) = start(&[fault("mute", &["--hang-at-start"])], t);
        let st = until("a failed attempt", || Some(status(&u, "mute")).filter(|s| s.last_error.is_some())).await;
        assert!(st.last_error.unwrap().contains("no answer to initialize"), "{:?}", status(&u, "mute"));
        assert_ne!(status(&u, "mute").state, State::Ready);
        u.shutdown().await;
    });
}

#[test]
fn hang_past_the_timeout_and_a_dropped_call_are_cancelled_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let rt = runtime();
    rt.block_on(async {
        let mut section = fault("fault", &["--log", log.to_str().unwrap()]);
        section.timeout = Duration::from_millis(700);
        let (u, _) = start(&[section], tuning());
        ready(&u, "fault").await;
        let err = u.call_tool("fault", "hang", Map::new(), None).await.unwrap_err();
        assert!(matches!(err, UpstreamError::Timeout { .. }), "{err:?}");
        until("the upstream saw the cancellation", || {
            lines(&log).iter().any(|l| l.starts_with("cancelled ")).then_some(())
        })
        .await;
        // A caller that goes away (its future dropped) before the deadline cancels too.
        let dropped =
            tokio::time::timeout(Duration::from_millis(200), u.call_tool("fault", "hang", Map::new(), None)).await;
        assert!(dropped.is_err());
        until("the second cancellation", || {
            (lines(&log).iter().filter(|l| l.starts_with("cancelled ")).count() == 2).then_some(())
        })
        .await;
        let ids: Vec<String> = lines(&log).into_iter().filter(|l| l.starts_with("cancelled ")).collect();
        assert_ne!(ids[0], ids[1], "each cancellation names its own request");
        // The connection is still good.
        assert!(u.call_tool("fault", "echo", args(json!({"text": "ok"})), None).await.is_ok());
        u.shutdown().await;
    });
}

#[test]
fn progress_is_forwarded_and_calls_are_pipelined() {
    let rt = runtime();
    rt.block_on(async {
        let (u, _) = start(&[fault("fault", &[])], tuning());
        ready(&u, "fault").await;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let result = u
            .call_tool(
                "fault",
                "progress",
                args(json!({"steps": 5})),
                Some(Arc::new(move |p: ctx::lua::Progress| sink.lock().unwrap().push(p))),
            )
            .await
            .unwrap();
        assert!(Value::Object(result.clone()).to_string().contains("done"), "{result:?}");
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 5, "every progress notification, before the result: {seen:?}");
        assert_eq!((seen[4].done, seen[4].total), (5.0, Some(5.0)));
        assert_eq!(seen[0].message.as_deref(), Some("step 1"));

        // Eight slow calls at once on the one connection take about one call's time.
        let pid = status(&u, "fault").pid;
        let started = Instant::now();
        let calls: Vec<_> = (0..8)
            .map(|_| {
                let u = u.clone();
                tokio::spawn(async move { u.call_tool("fault", "slow", args(json!({"ms": 1000})), None).await })
            })
            .collect();
        for call in calls {
            call.await.unwrap().unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(6), "pipelined, not serialised: {:?}", started.elapsed());
        assert_eq!(status(&u, "fault").pid, pid, "one shared connection, one process");
        u.shutdown().await;
    });
}

#[test]
fn list_changed_relists_and_emits_an_event() {
    let rt = runtime();
    rt.block_on(async {
        // 300 lines of 1 KiB on stderr at start: read and bounded, they block nothing.
        let (u, events) = start(&[fault("fault", &["--stderr-lines", "300"])], tuning());
        ready(&u, "fault").await;
        let before = events.lock().unwrap().len();
        assert!(!tool_names(&u, "fault").contains(&"fresh".to_string()));
        u.call_tool("fault", "add_tool", args(json!({"name": "fresh"})), None).await.unwrap();
        until("the new tool in the catalog", || tool_names(&u, "fault").contains(&"fresh".to_string()).then_some(()))
            .await;
        let new: Vec<Event> = events.lock().unwrap()[before..].to_vec();
        assert!(new.iter().any(|e| e.server == "fault" && e.tools), "{new:?}");
        let answer = u.call_tool("fault", "fresh", args(json!({"text": "new"})), None).await.unwrap();
        assert!(Value::Object(answer.clone()).to_string().contains("new"), "{answer:?}");
        u.shutdown().await;
    });
}

#[test]
fn the_child_gets_only_its_env() {
    // A variable of ctx's own (cargo sets it for the test process) must not reach the child.
    let own = "CARGO_MANIFEST_DIR";
    assert!(std::env::var_os(own).is_some(), "the test needs {own} set in its own environment");
    let rt = runtime();
    rt.block_on(async {
        let mut section = fault("fault", &[]);
        if let UpstreamTransport::Stdio { env, .. } = &mut section.transport {
            env.insert("GIVEN".to_string(), "yes".to_string());
        }
        let (u, _) = start(&[section], tuning());
        ready(&u, "fault").await;
        let value = |name: &str| {
            let u = u.clone();
            let name = name.to_string();
            async move {
                let r = u.call_tool("fault", "env", args(json!({"name": name})), None).await.unwrap();
                r["structuredContent"]["value"].clone()
            }
        };
        assert_eq!(value("GIVEN").await, json!("yes"));
        assert_eq!(value(own).await, Value::Null, "ctx's environment leaked into the child");
        assert_eq!(value("PATH").await, Value::Null, "not in the env map, so not passed");
        u.shutdown().await;
    });
}

#[test]
fn apply_restarts_only_the_changed_server() {
    let rt = runtime();
    rt.block_on(async {
        let a = fault("a", &[]);
        let b = fault("b", &[]);
        let (u, _) = start(&[a.clone(), b.clone()], tuning());
        let (a0, b0) = (ready(&u, "a").await, ready(&u, "b").await);
        u.apply(&[a.clone(), b.clone()]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!((status(&u, "a").pid, status(&u, "b").pid), (a0.pid, b0.pid), "nothing changed, nothing restarted");

        let mut b2 = b.clone();
        b2.timeout = Duration::from_secs(5);
        let c = fault("c", &[]);
        u.apply(&[a.clone(), b2, c]);
        let b1 = until("b restarted", || {
            let s = status(&u, "b");
            (s.state == State::Ready && s.pid != b0.pid).then_some(s)
        })
        .await;
        ready(&u, "c").await;
        let a1 = status(&u, "a");
        assert_eq!((a1.pid, a1.restarts, a1.state), (a0.pid, 0, State::Ready), "a untouched");
        assert!(b1.pid.is_some());
        let old_b = b0.pid.unwrap() as i32;
        until("the old b process gone", || (!alive(old_b)).then_some(())).await;

        let c1 = status(&u, "c").pid.unwrap() as i32;
        u.apply(&[a]);
        assert_eq!(u.status().iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["a"]);
        until("b and c stopped", || (!alive(b1.pid.unwrap() as i32) && !alive(c1)).then_some(())).await;
        assert_eq!(status(&u, "a").pid, a0.pid);
        u.shutdown().await;
    });
}

#[test]
fn a_hundred_restarts_leave_no_process_behind() {
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let rt = runtime();
    rt.block_on(async {
        let section = fault("fault", &["--grandchild", "--starts", starts.to_str().unwrap()]);
        // Every crash is a recent failure: keep the backoff short so that 100 take seconds.
        let (u, _) = start(&[section], Tuning { backoff_max: Duration::from_millis(20), ..tuning() });
        let began = Instant::now();
        for round in 1..=100 {
            until(&format!("start {round} ready"), || {
                (status(&u, "fault").state == State::Ready && lines(&starts).len() == round).then_some(())
            })
            .await;
            let _ = u.call_tool("fault", "crash", Map::new(), None).await;
        }
        until("start 101 ready", || {
            (status(&u, "fault").state == State::Ready && lines(&starts).len() == 101).then_some(())
        })
        .await;
        println!("100 crash-restart cycles: {:?}", began.elapsed());
        u.shutdown().await;
    });
    let recorded: Vec<i32> = lines(&starts).iter().flat_map(|l| pids(l)).collect();
    assert!(recorded.len() >= 202, "each start recorded the server and its `sleep 3600`: {}", recorded.len());
    // The guards reap what they started; allow a moment for the last group to go.
    let deadline = Instant::now() + WAIT;
    loop {
        let left: Vec<i32> = recorded.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "{} processes outlived their server: {left:?}", left.len());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// ctx killed with SIGKILL: the guard it started gets its parent-death signal and takes the
/// server's whole group (here a server and its `sleep` grandchild) with it. The parent is a
/// shell standing in for ctx, so that the test can kill it.
#[test]
fn kill_9_of_the_parent_leaves_no_child() {
    let dir = tempfile::tempdir().unwrap();
    let grandchild = dir.path().join("grandchild");
    let guard = dir.path().join("guard");
    let script = r#""$1" __upstream-guard $$ /bin/sh -c "sleep 3600 & echo \$! > '$2'; exec sleep 3601" &
echo $! > "$3"
wait"#;
    let mut parent = std::process::Command::new("/bin/sh")
        .args(["-c", script, "sh", BIN, grandchild.to_str().unwrap(), guard.to_str().unwrap()])
        .spawn()
        .unwrap();
    let read_pid = |p: &Path| std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse::<i32>().ok());
    let deadline = Instant::now() + WAIT;
    let (guard_pid, sleeper) = loop {
        if let (Some(g), Some(s)) = (read_pid(&guard), read_pid(&grandchild)) {
            break (g, s);
        }
        assert!(Instant::now() < deadline, "the guarded command did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    let server: i32 = std::fs::read_to_string(format!("/proc/{guard_pid}/task/{guard_pid}/children"))
        .unwrap()
        .split_whitespace()
        .next()
        .expect("the guard's child")
        .parse()
        .unwrap();
    let rss = std::fs::read_to_string(format!("/proc/{guard_pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .map(str::to_string)
        .unwrap_or_default();
    println!("guard {guard_pid}: {rss}");
    assert!(alive(guard_pid) && alive(server) && alive(sleeper));

    parent.kill().unwrap(); // SIGKILL
    parent.wait().unwrap();
    let deadline = Instant::now() + WAIT;
    while [guard_pid, server, sleeper].iter().any(|&p| alive(p)) {
        assert!(
            Instant::now() < deadline,
            "left behind: guard {} server {} sleep {}",
            alive(guard_pid),
            alive(server),
            alive(sleeper)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Streamable HTTP: a real `ctx serve` as the upstream, behind its bearer token, which the
/// section's `headers` carry.
#[test]
fn streamable_http_upstream_with_headers() {
    let token = "gateway-17-token-0123456789";
    let ws = Workspace::new(&format!(
        "[server]\nauth_token = \"{token}\"\n\n[tools.script.echo]\npath = \"tools/echo.lua\"\n"
    ));
    ws.write("tools/echo.lua", &std::fs::read_to_string(crate::common::repo().join("tools/echo.lua")).unwrap());
    let served = ServeChild::spawn(
        std::process::Command::new(BIN)
            .current_dir(ws.path())
            .args(["--config", "ctx.toml", "serve", "--bind", "127.0.0.1:0"])
            .env_remove("CTX_CONFIG")
            .env_remove("CTX_LOG"),
    );
    let http = |name: &str, auth: Option<&str>| UpstreamSection {
        transport: UpstreamTransport::Http {
            url: format!("http://{}/mcp", served.addr),
            headers: auth.map(|a| ("Authorization".to_string(), a.to_string())).into_iter().collect(),
        },
        ..fault(name, &[])
    };
    let rt = runtime();
    rt.block_on(async {
        let mut t = tuning();
        t.backoff_base = Duration::from_millis(200);
        let (u, _) = start(&[http("ctx", Some(&format!("Bearer {token}"))), http("anon", None)], t);
        ready(&u, "ctx").await;
        assert!(tool_names(&u, "ctx").contains(&"echo".to_string()), "{:?}", tool_names(&u, "ctx"));
        let echoed = u.call_tool("ctx", "echo", args(json!({"message": "over http"})), None).await.unwrap();
        assert!(Value::Object(echoed.clone()).to_string().contains("over http"), "{echoed:?}");
        let anon =
            until("the anonymous one failed", || Some(status(&u, "anon")).filter(|s| s.last_error.is_some())).await;
        assert_ne!(anon.state, State::Ready);
        assert_eq!(anon.transport, "http");
        assert!(!anon.last_error.unwrap().contains(token));
        u.shutdown().await;
    });
}

#[test]
fn shutdown_stops_every_server_and_reaps_it() {
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let rt = runtime();
    let counted = Arc::new(AtomicUsize::new(0));
    rt.block_on(async {
        let s = |n: &str| fault(n, &["--grandchild", "--starts", starts.to_str().unwrap()]);
        let (u, _) = start(&[s("one"), s("two"), s("three")], tuning());
        for name in ["one", "two", "three"] {
            ready(&u, name).await;
        }
        let began = Instant::now();
        u.shutdown().await;
        assert!(began.elapsed() < Duration::from_secs(10), "bounded: {:?}", began.elapsed());
        counted.store(lines(&starts).len(), Ordering::SeqCst);
        for name in ["one", "two", "three"] {
            assert_eq!(status(&u, name).state, State::Disabled);
        }
    });
    assert_eq!(counted.load(Ordering::SeqCst), 3);
    let recorded: Vec<i32> = lines(&starts).iter().flat_map(|l| pids(l)).collect();
    assert_eq!(recorded.len(), 6);
    let left: Vec<i32> = recorded.into_iter().filter(|&p| alive(p)).collect();
    assert!(left.is_empty(), "alive after shutdown: {left:?}");
}

#[test]
fn last_error_names_no_env_value() {
    let secret = "s3cr3t-value-0123456789";
    let rt = runtime();
    rt.block_on(async {
        let section = UpstreamSection {
            transport: UpstreamTransport::Stdio {
                command: "/bin/sh".to_string(),
                args: vec!["-c".to_string(), "echo \"token is $API_TOKEN\" >&2; exit 3".to_string()],
                env: [("API_TOKEN".to_string(), secret.to_string())].into_iter().collect(),
                cwd: None,
            },
            ..fault("leaky", &[])
        };
        let (u, _) = start(&[section], tuning());
        let st = until("a failed attempt", || Some(status(&u, "leaky")).filter(|s| s.last_error.is_some())).await;
        let error = st.last_error.unwrap();
        assert!(error.contains("status 3") && error.contains("token is ***"), "{error}");
        assert!(!error.contains(secret), "{error}");
        u.shutdown().await;
    });
}
