//! A flooding upstream and parameters that read differently than they are, on a real `ctx serve`:
//! an upstream that sends notifications without end (the fault upstream's `spew`) costs ctx
//! nothing once its call is cancelled, is restarted when it keeps it up, and is not a log line
//! per notification with `-v`; bidirectional controls in a call's parameters show escaped
//! wherever a person reads them.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{ServeChild, Workspace, BIN};
use crate::gateway::{fault_section, serve, Served};

/// `ctx <args> serve` on 127.0.0.1:0 (the global flags go before the subcommand).
fn serve_with_flags(ws: Workspace, flags: &[&str]) -> Served {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut command = Command::new(BIN);
    command.current_dir(ws.path()).args(flags).args(["serve", "--bind", "127.0.0.1:0"]).env_remove("CTX_LOG");
    let serve = ServeChild::spawn(&mut command);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    Served { ws, serve, runtime, client: reqwest::Client::new() }
}

/// The CPU time (user and system) process `pid` has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the process's stat");
    // Fields after the command name (which may hold spaces): utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(')').expect("a stat line").1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_micros(ticks * 1_000_000 / per_second)
}

/// The share of one core `pid` used over the next `span`.
fn cpu_share(pid: u32, span: Duration) -> f64 {
    let before = cpu_time(pid);
    std::thread::sleep(span);
    (cpu_time(pid) - before).as_secs_f64() / span.as_secs_f64()
}

/// A POST from another thread (a call that blocks while the test does other things).
fn post_in_background(url: String, body: Value) -> std::thread::JoinHandle<(u16, Value, Duration)> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let started = Instant::now();
            let client = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
            let response = client.post(url).json(&body).send().await.expect("an answer");
            let status = response.status().as_u16();
            (status, response.json().await.unwrap_or(Value::Null), started.elapsed())
        })
    })
}

#[test]
fn a_cancelled_call_against_a_flooding_upstream_leaves_ctx_idle_within_seconds() {
    let ws = Workspace::new(&fault_section("fault", &["--spew"], "timeout = 1"));
    let served = serve(ws, &[]);
    served.ready("fault");
    let pid = served.serve.child.id();
    let idle = cpu_share(pid, Duration::from_secs(1));
    // The call's deadline cancels it upstream (notifications/cancelled), which `spew` ignores:
    // it goes on sending 2 KiB progress notifications as fast as it can.
    let (status, body) = served.post("/tools/fault__spew", json!({"kind": "progress"}));
    assert_eq!(status, 408, "{body}");
    std::thread::sleep(Duration::from_secs(2));
    let busy = cpu_share(pid, Duration::from_secs(3));
    // Reading the flood took about a third of a core here; idle is about 0.
    assert!(
        busy < 0.10,
        "ctx used {:.0} % of a core from 2 to 5 s after the call was cancelled (idle: {:.0} %)\nlog:\n{}",
        busy * 100.0,
        idle * 100.0,
        served.log()
    );
}

#[test]
fn a_sustained_flood_gets_the_server_restarted_with_one_warning_while_ctx_answers_other_calls() {
    let sections = format!("{}{}", fault_section("flood", &["--spew"], ""), fault_section("calm", &[], ""));
    let served = serve(Workspace::new(&sections), &[]);
    served.ready("flood");
    served.ready("calm");
    // Logging messages, this time, with no end and no deadline short of the default 60 s.
    let url = format!("http://{}/tools/flood__spew", served.serve.addr);
    let flood = post_in_background(url, json!({"kind": "log"}));
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        let asked = Instant::now();
        let (status, body) = served.post("/tools/calm__echo", json!({"text": "still here"}));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["text"], "still here", "{body}");
        assert!(asked.elapsed() < Duration::from_secs(5), "a call to another server took {:?}", asked.elapsed());
        std::thread::sleep(Duration::from_millis(200));
    }
    let row =
        served.wait("flood", Duration::from_secs(30), |u| u["restarts"].as_u64() >= Some(1) && u["state"] == "ready");
    let why = row["last_error"].as_str().unwrap_or_default();
    assert!(why.contains("a flood") && why.contains("notifications"), "{row}");
    // The flooding call failed when its connection was cut, well before its own deadline.
    let (status, body, took) = flood.join().unwrap();
    assert_ne!(status, 200, "{body}");
    assert!(body.to_string().contains("disconnected"), "{body}");
    assert!(took < Duration::from_secs(30), "the flooding call ended after {took:?}");
    // The restarted server answers.
    let (status, body) = served.post("/tools/flood__echo", json!({"text": "back"}));
    assert_eq!(status, 200, "{body}");
    // One warning, naming the server and why; not one per message.
    let log = served.log();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN") && l.contains("a flood")).collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(warnings[0].contains("server=flood"), "{log}");
}

#[test]
fn with_v_a_notification_flood_is_not_a_log_line_per_notification() {
    let ws = Workspace::new(&fault_section("fault", &["--spew"], ""));
    let served = serve_with_flags(ws, &["-v"]);
    served.ready("fault");
    let before = served.log().lines().count();
    // Long enough for thousands, short of the seconds that get a server cut off.
    let (status, body) = served.post("/tools/fault__spew", json!({"kind": "progress", "seconds": 1.2}));
    assert_eq!(status, 200, "{body}");
    // `spewed N`, however the text result is wrapped.
    let said = body.to_string();
    let count = said.split("spewed ").nth(1).map(|rest| rest.chars().take_while(char::is_ascii_digit).collect());
    let sent: u64 = count.and_then(|n: String| n.parse().ok()).unwrap_or_else(|| panic!("{body}"));
    assert!(sent >= 1000, "the upstream sent only {sent} notifications: not a flood");
    std::thread::sleep(Duration::from_millis(500));
    let log = served.log();
    let lines = log.lines().count() - before;
    assert!(
        lines < 50,
        "{sent} notifications made {lines} log lines with -v:\n{}",
        &log[log.len().saturating_sub(3000)..]
    );
}

#[test]
fn bidi_controls_in_parameters_show_escaped_in_approvals_list_and_log() {
    use crate::scoped_tokens_and_rates::{serve, CI};
    let s = serve("\n[approval]\ntools = [\"echo\"]\n");
    // Reads "refund $100 to bob" in a terminal that honours the override.
    let message = "refund \u{202e}001$\u{202c} to bob";
    let escaped = "refund \\u{202e}001$\\u{202c} to bob";
    let raw = ['\u{202e}', '\u{202c}'];
    let (status, pending, _) = s.send_with("/tools/echo", Some(CI), &[], json!({"message": message}));
    assert_eq!(status, 202, "{pending}");
    let (id, token) = (pending["id"].as_str().unwrap(), pending["token"].as_str().unwrap());

    let listed = s.cli(&["approvals", "list"]).ok();
    assert!(listed.contains(escaped) && !listed.contains(raw), "{listed}");
    let approved = s.cli(&["approvals", "approve", id]).ok();
    assert!(approved.contains(escaped) && !approved.contains(raw), "{approved}");
    let (status, ran, _) =
        s.send_with("/tools/echo", Some(CI), &[("ctx-approval", token)], json!({"message": message}));
    assert_eq!(status, 200, "{ran}");
    // The JSON keeps the text as it is (JSON readers are not fooled by it).
    assert_eq!(ran["result"]["message"], message);

    // The call log: the human view escapes it (the writer is behind the call path).
    let deadline = Instant::now() + Duration::from_secs(10);
    let shown = loop {
        let shown = s.cli(&["log", "--tool", "echo"]).ok();
        if shown.lines().filter(|l| l.contains("refund")).count() >= 2 || Instant::now() > deadline {
            break shown;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(shown.contains(escaped) && !shown.contains(raw), "{shown}");
    assert!(shown.lines().filter(|l| l.contains(escaped)).count() >= 2, "the asking call and the run: {shown}");
}
