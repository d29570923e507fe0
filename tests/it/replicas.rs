//! Several real `ctx serve` replicas on one real PostgreSQL database (`[db] url`): an approval
//! asked through one is approved through a second and runs through a third, once; a rate limit
//! holds across all of them; `/health` names the backend and is degraded while the database is
//! down, and the replica recovers by itself when it is back.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::scoped_tokens_and_rates::{serve, Server, ADMIN, CI};

const APPROVER: &str = "approver-token-0123456789";

/// `n` replicas of one config on `url`, each with its own workspace (as on its own machine) and
/// name.
fn replicas(url: &str, n: usize, extra: &str) -> Vec<Server> {
    (0..n).map(|i| serve(&format!("{extra}\n[db]\nurl = \"{url}\"\nreplica = \"replica-{i}\"\n"))).collect()
}

fn health(s: &Server) -> Value {
    s.get("/health", Some(ADMIN)).1
}

#[test]
fn an_approval_asked_through_one_replica_is_approved_through_a_second_and_runs_once_through_a_third() {
    let Some(db) = ctx::db::testing::database() else { return };
    let r = replicas(&db.url, 3, &format!("\n[approval]\ntools = [\"echo\"]\napprover_token = \"{APPROVER}\"\n"));
    let (status, pending, _) = r[0].send_with("/tools/echo", Some(CI), &[], json!({"message": "deploy"}));
    assert_eq!(status, 202, "{pending}");
    let (id, token) = (pending["id"].as_str().unwrap().to_string(), pending["token"].as_str().unwrap().to_string());
    // The second replica lists it and approves it.
    let (_, listed) = r[1].get("/approvals", Some(ADMIN));
    assert!(listed.to_string().contains(&id), "{listed}");
    let approve =
        r[1].send_with(&format!("/approvals/{id}/approve"), Some(ADMIN), &[("ctx-approver", APPROVER)], json!({}));
    assert_eq!(approve.0, 200, "{}", approve.1);
    // The third runs it, once; the first then refuses the used token.
    let with_token =
        |s: &Server| s.send_with("/tools/echo", Some(CI), &[("ctx-approval", &token)], json!({"message": "deploy"}));
    let (status, body, _) = with_token(&r[2]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["message"], "deploy");
    let (status, body, _) = with_token(&r[0]);
    assert_eq!(status, 403, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("used already"), "{body}");
    // The CLI beside any replica sees the same approvals.
    let listed = r[2].cli(&["approvals", "list", "--all"]);
    assert!(listed.ok().contains(&id), "{}", listed.stdout());
    // One call log: the first replica's `GET /calls` has the run through the third, naming it,
    // and `ctx log` beside the second shows it too.
    let deadline = Instant::now() + Duration::from_secs(10);
    let ran = loop {
        let (_, calls) = r[0].get("/calls?tool=echo&limit=100", Some(ADMIN));
        let found = calls["calls"].as_array().unwrap().iter().find(|c| c["outcome"] == "ok").cloned();
        if let Some(found) = found {
            break found;
        }
        assert!(Instant::now() < deadline, "the run never reached the shared log: {calls}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(ran["replica"], "replica-2", "{ran}");
    let log = r[1].cli(&["log", "--tool", "echo"]);
    assert!(log.ok().contains("replica-2"), "{}", log.stdout());
}

#[test]
fn a_rate_limit_lets_exactly_its_burst_through_across_three_replicas() {
    let Some(db) = ctx::db::testing::database() else { return };
    let r = replicas(&db.url, 3, "\n[[server.rate_limits]]\ntools = [\"echo\"]\nrate = \"1/hour\"\nburst = 5\n");
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let calls: Vec<_> = (0..21)
            .map(|i| {
                let replica = &r[i % 3];
                s.spawn(move || replica.send_with("/tools/echo", Some(CI), &[], json!({"message": "m"})).0)
            })
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 5, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 16, "{statuses:?}");
    // Another caller has its own bucket, on every replica.
    assert_eq!(r[2].send_with("/tools/echo", Some(ADMIN), &[], json!({"message": "m"})).0, 200);
}

/// A PostgreSQL server of this test's own (`scripts/pg up`), which it stops and starts.
struct Cluster {
    dir: String,
    admin_url: String,
}

impl Cluster {
    fn up() -> Cluster {
        let out = Command::new(crate::common::repo().join("scripts/pg")).arg("up").output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        let var = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}='")))
                .map(|v| v.trim_end_matches('\'').to_string())
                .unwrap_or_else(|| panic!("no {name} in {text}"))
        };
        Cluster { dir: var("CTX_TEST_PG_DIR"), admin_url: var("CTX_TEST_DATABASE_URL") }
    }

    fn pg(&self, what: &str) {
        let out = Command::new(crate::common::repo().join("scripts/pg")).args([what, &self.dir]).output().unwrap();
        assert!(out.status.success(), "scripts/pg {what}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(crate::common::repo().join("scripts/pg")).args(["down", &self.dir]).output();
    }
}

/// Polls `/health` until `done` says yes, or fails after `within`.
fn wait_health(s: &Server, within: Duration, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let seen = health(s);
        if done(&seen) {
            return seen;
        }
        assert!(Instant::now() < deadline, "health never changed: {seen}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_replica_is_degraded_while_postgresql_is_down_fails_fast_and_recovers_by_itself() {
    // Skipped, like every PostgreSQL test, when the suite has no server.
    if ctx::db::testing::admin().is_none() {
        return;
    }
    let cluster = Cluster::up();
    let admin = ctx::db::testing::pool(ctx::db::DbUrl::parse(&cluster.admin_url, None).unwrap());
    let db = ctx::db::testing::database_on(admin, &cluster.admin_url);
    let r = replicas(&db.url, 2, "\n[[server.rate_limits]]\ntools = [\"echo\"]\nrate = \"100000/min\"\n");
    // Load on both replicas all along: searches and rate-limited calls, from four threads.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let answered = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for i in 0..4 {
            let (replica, stop, answered) = (&r[i % 2], &stop, &answered);
            scope.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (status, _, _) = replica.send_with("/tools/echo", Some(CI), &[], json!({"message": "load"}));
                    let (searched, _) = replica.post("/tools/search", Some(ADMIN), json!({"query": "runbook"}));
                    if status == 200 && searched == 200 {
                        answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
        let up = health(&r[0]);
        assert_eq!(up["status"], "ok", "{up}");
        assert_eq!(up["database"]["backend"], "postgres", "{up}");
        assert_eq!(up["database"]["status"], "ok", "{up}");
        assert_eq!(up["database"]["replica"], "replica-0", "{up}");
        let shown = up["database"]["database"].as_str().unwrap();
        assert!(!shown.contains(db.url.split(':').nth(2).unwrap().split('@').next().unwrap()), "no password: {shown}");
        assert_eq!(r[0].send_with("/tools/echo", Some(CI), &[], json!({"message": "m"})).0, 200);

        cluster.pg("stop");
        let down = wait_health(&r[0], Duration::from_secs(10), |h| h["status"] == "degraded");
        assert_eq!(down["database"]["status"], "unavailable", "{down}");
        assert!(down["database"]["error"].as_str().is_some_and(|e| !e.is_empty()), "{down}");
        // Without the token, only the status.
        let (_, bare) = r[0].get("/health", None);
        assert_eq!(bare["status"], "degraded", "{bare}");
        assert!(bare.get("database").is_none(), "{bare}");
        // A call that needs the database fails at once, saying why.
        let started = Instant::now();
        let (status, body, _) = r[0].send_with("/tools/echo", Some(CI), &[], json!({"message": "m"}));
        assert_eq!(status, 503, "{body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("database"), "{body}");
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());

        // Searches go on from each replica's copy meanwhile.
        let (status, found) = r[1].post("/tools/search", Some(ADMIN), json!({"query": "runbook"}));
        assert_eq!(status, 200, "{found}");

        cluster.pg("start");
        for replica in &r {
            let back = wait_health(replica, Duration::from_secs(20), |h| h["status"] == "ok");
            assert_eq!(back["database"]["status"], "ok", "{back}");
            let (status, body, _) = replica.send_with("/tools/echo", Some(CI), &[], json!({"message": "again"}));
            assert_eq!(status, 200, "{body}");
        }
        // The load is answered again, on both, without a restart.
        let before = answered.load(std::sync::atomic::Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(10);
        while answered.load(std::sync::atomic::Ordering::Relaxed) < before + 20 {
            assert!(Instant::now() < deadline, "the load is not answered again after the database came back");
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    drop(r);
    drop(db);
}

#[test]
fn a_replica_answers_many_searches_at_once_while_its_copy_catches_up() {
    let Some(db) = ctx::db::testing::database() else { return };
    let r = replicas(&db.url, 2, "");
    // One replica writes while the other is searched by twenty callers at once: its copy catches
    // up under them (a catch-up once held every async worker and the query it waited for
    // never ran).
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            for n in 0..5 {
                r[0].ws.write(&format!("docs/new-{n}.md"), &format!("# New {n}\n\nThe runbook, part {n}.\n"));
                r[0].cli(&["sync"]).ok();
            }
        });
        let searches: Vec<_> = (0..20)
            .map(|_| {
                scope.spawn(|| {
                    for _ in 0..10 {
                        let (status, body) = r[1].post("/tools/search", Some(ADMIN), json!({"query": "runbook"}));
                        assert_eq!(status, 200, "{body}");
                    }
                })
            })
            .collect();
        for search in searches {
            search.join().unwrap();
        }
        writer.join().unwrap();
    });
    let (_, found) = r[1].post("/tools/search", Some(ADMIN), json!({"query": "runbook", "limit": 20}));
    assert_eq!(found["results"].as_array().unwrap().len(), 6, "{found}");
}

#[test]
fn a_sync_from_any_machine_is_seen_by_a_search_on_every_replica() {
    let Some(db) = ctx::db::testing::database() else { return };
    let r = replicas(&db.url, 3, "");
    // Each replica's own `ctx sync` indexed the shared docs folder's runbook before it started.
    let search = |s: &Server, word: &str| {
        let (status, body) = s.post("/tools/search", Some(ADMIN), json!({"query": word}));
        assert_eq!(status, 200, "{body}");
        body["results"].as_array().unwrap().iter().map(|h| h["title"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(search(&r[2], "runbook"), vec!["Deploy"]);
    // A new document synced beside the first replica...
    r[0].ws.write("docs/rollback.md", "# Rollback\n\nThe quokka procedure undoes a release.\n");
    let synced = r[0].cli(&["sync", "--json"]);
    assert!(synced.ok().contains("\"added\":1"), "{}", synced.stdout());
    // ...is found through every replica, the other two included.
    for replica in &r {
        let deadline = Instant::now() + Duration::from_secs(5);
        while search(replica, "quokka").is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(search(replica, "quokka"), vec!["Rollback"]);
    }
}

/// The `echo` calls a replica served, from its `/metrics`.
fn echo_calls(s: &Server) -> u64 {
    let text = s.get_text("/metrics", Some(ADMIN));
    text.lines()
        .filter(|l| l.starts_with("ctx_tool_calls_total{tool=\"echo\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// HAProxy with `examples/deploy/haproxy.cfg`, in front of `replicas`; stopped on drop.
struct Balancer {
    child: std::process::Child,
    url: String,
}

impl Balancer {
    fn start(replicas: &[Server]) -> Option<Balancer> {
        let Ok(haproxy) = which("haproxy") else {
            assert!(std::env::var_os("CI").is_none(), "no haproxy: scripts/test-env installs it");
            eprintln!("skipped: no haproxy (apt-get install haproxy)");
            return None;
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut command = Command::new(haproxy);
        command
            .args(["-db", "-f"])
            .arg(crate::common::repo().join("examples/deploy/haproxy.cfg"))
            .env("CTX_LB_BIND", format!("127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        for (i, replica) in replicas.iter().enumerate() {
            command.env(format!("CTX_REPLICA_{}", i + 1), &replica.serve.addr);
        }
        let child = command.spawn().expect("haproxy starts");
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "haproxy did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Balancer { child, url })
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn which(program: &str) -> Result<std::path::PathBuf, ()> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .ok_or(())
}

/// Runs `tests/clients/mcp_replicas.py` (the official Python SDK) for one era through `url`.
fn sdk_through(url: &str, era: &str, calls: usize) -> Option<String> {
    let python = crate::common::test_python()?;
    let output = Command::new(python)
        .arg(crate::common::repo().join("tests/clients/mcp_replicas.py"))
        .args(["--url", url, "--token", ADMIN, "--era", era, "--calls", &calls.to_string()])
        .output()
        .expect("run mcp_replicas.py");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{era}:\n{stdout}\n{stderr}");
    Some(stdout.into_owned())
}

#[test]
fn mcp_sessions_stick_to_their_replica_behind_the_example_haproxy_and_stateless_calls_spread() {
    let Some(db) = ctx::db::testing::database() else { return };
    let r = replicas(&db.url, 3, "");
    let Some(lb) = Balancer::start(&r) else { return };
    let before: Vec<u64> = r.iter().map(echo_calls).collect();
    // A 2025-11-25 session: every request after initialize names it, and only its replica
    // knows it; all eight calls succeed, so all reached that one replica.
    let Some(out) = sdk_through(&lb.url, "2025", 8) else { return };
    assert!(out.contains("ok: 2025 8"), "{out}");
    let after_session: Vec<u64> = r.iter().map(echo_calls).collect();
    let served: Vec<u64> = after_session.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(served.iter().filter(|n| **n > 0).count(), 1, "one replica served the session: {served:?}");
    assert_eq!(served.iter().sum::<u64>(), 8);
    // The 2026-07-28 era is stateless: any replica answers. Three clients (three connections;
    // HAProxy keeps one client connection on one server) go round the replicas.
    for _ in 0..3 {
        let out = sdk_through(&lb.url, "2026", 3).unwrap();
        assert!(out.contains("ok: 2026 3"), "{out}");
    }
    let spread: Vec<u64> = r.iter().map(echo_calls).zip(&after_session).map(|(a, b)| a - b).collect();
    assert_eq!(spread.iter().sum::<u64>(), 9, "{spread:?}");
    assert!(spread.iter().filter(|n| **n > 0).count() >= 2, "stateless calls reached several replicas: {spread:?}");
}
