//! A stopped run stays stopped on a real `ctx serve`: Lua that would run after the stop (a
//! to-be-closed variable's `__close`, a coroutine's closes) is stopped by the same deadline, the
//! tool is not quarantined, no core is left spinning, and SIGTERM ends the server.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::scoped_tokens_and_rates::{serve_with, CI};

const CLOSE_SPINS: &str = "setmetatable({}, {__close = function() while true do end end})";

/// CPU seconds (user + system) the process has used, from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

#[test]
fn a_close_handler_cannot_outlive_a_stopped_script() {
    let scripted = "\n[tools.scripted.closer]\ndescription = \"Runs a script with a one-second deadline.\"\ntools = [\"search\"]\ntimeout = 1\n";
    let mut server = serve_with(scripted, &[]);
    let bodies = [
        format!("local x <close> = {CLOSE_SPINS}\nwhile true do end"),
        format!("local co = coroutine.wrap(function() local x <close> = {CLOSE_SPINS} while true do end end) co()"),
        format!("pcall(function() local x <close> = {CLOSE_SPINS} while true do end end) return 'survived'"),
    ];
    for body in &bodies {
        // As a scoped caller, through `execute` with a one-second timeout.
        let started = Instant::now();
        let (status, reply) = server.post("/tools/execute", Some(CI), json!({"timeout": 1, "script": body}));
        assert_eq!(status, 408, "{body}: {reply}");
        assert!(started.elapsed() < Duration::from_secs(5), "{body}: took {:?}", started.elapsed());
        // Through a scripted tool (its own deadline), as the admin.
        let started = Instant::now();
        let (status, reply) =
            server.post("/tools/closer", Some(crate::scoped_tokens_and_rates::ADMIN), json!({"script": body}));
        assert_eq!(status, 408, "{body}: {reply}");
        assert!(started.elapsed() < Duration::from_secs(5), "{body}: took {:?}", started.elapsed());
    }
    // Nothing was quarantined and nothing degraded: the next run is served as usual.
    let (status, reply) = server.post("/tools/execute", Some(CI), json!({"script": "return 6 * 7"}));
    assert_eq!((status, &reply["result"]), (200, &json!(42)), "{reply}");
    let (status, health) = server.get("/health", Some(crate::scoped_tokens_and_rates::ADMIN));
    assert_eq!((status, &health["status"]), (200, &json!("ok")), "{health}");
    // No thread is left spinning: the server is idle again.
    let pid = server.serve.child.id();
    std::thread::sleep(Duration::from_millis(300));
    let before = cpu_seconds(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_seconds(pid) - before;
    assert!(used < 0.5, "the idle server used {used:.2} s of CPU in 2 s: a stopped run is still spinning");
    // SIGTERM ends it promptly.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let started = Instant::now();
    loop {
        if let Some(status) = server.serve.child.try_wait().unwrap() {
            assert!(status.success(), "{status:?}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "ctx serve did not exit within 15 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}
