//! wrk, the HTTP load generator the benches drive: found or installed, run, and read.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// One wrk run's numbers.
pub struct Load {
    pub rate: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub requests: u64,
    pub errors: u64,
}

/// What every wrk script shares: each response is checked (status 200, the body holds `need`,
/// no `"isError":true`), and `done` prints the failed count, which [`parse_wrk`] reads.
pub fn checked(need: &str, rest: &str) -> String {
    format!(
        "local threads = {{}}\n\
         function setup(thread) table.insert(threads, thread) end\n\
         function init(args) failed = 0 end\n\
         function response(status, headers, body)\n\
         \x20 if status ~= 200 or not body:find({need:?}, 1, true) or body:find('\"isError\":true', 1, true) then\n\
         \x20   failed = failed + 1\n\
         \x20 end\n\
         end\n\
         function done(summary, latency, requests)\n\
         \x20 local total = 0\n\
         \x20 for _, t in ipairs(threads) do total = total + t:get(\"failed\") end\n\
         \x20 io.write(string.format(\"Failed calls: %d\\n\", total))\n\
         end\n{rest}"
    )
}

pub fn find_wrk() -> PathBuf {
    let found = || {
        std::env::var_os("PATH")
            .and_then(|paths| std::env::split_paths(&paths).map(|p| p.join("wrk")).find(|p| p.is_file()))
    };
    if let Some(wrk) = found() {
        return wrk;
    }
    let root = Command::new("id").arg("-u").output().map(|o| o.stdout == b"0\n").unwrap_or(false);
    if root {
        println!("wrk not found: installing it from Debian (apt-get install -y wrk)");
        let installed = Command::new("apt-get")
            .args(["install", "-y", "-q", "wrk"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !installed {
            let _ = Command::new("apt-get").args(["update", "-q"]).status();
            let _ = Command::new("apt-get").args(["install", "-y", "-q", "wrk"]).status();
        }
    }
    found().unwrap_or_else(|| {
        eprintln!("this benchmark needs wrk: sudo apt-get install wrk");
        std::process::exit(2)
    })
}

pub fn wrk_run(wrk: &Path, base: &str, path: &str, script: Option<&Path>, secs: u64) -> Load {
    let mut command = Command::new(wrk);
    command.args(["-t2", "-c8", "--latency", &format!("-d{secs}s")]);
    if let Some(script) = script {
        command.arg("-s").arg(script);
    }
    let output = command.arg(format!("{base}{path}")).output().expect("run wrk");
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "wrk failed: {text}{}", String::from_utf8_lossy(&output.stderr));
    parse_wrk(&text).unwrap_or_else(|| panic!("cannot read wrk's output:\n{text}"))
}

/// Reads requests/s, the 50% and 99% latencies, the request count and the errors from wrk's
/// `--latency` report; errors are socket errors, non-2xx answers and the failed calls the
/// script's `done` printed (see [`checked`]).
pub fn parse_wrk(text: &str) -> Option<Load> {
    let field = |prefix: &str| {
        text.lines().find_map(|l| l.trim_start().strip_prefix(prefix).map(|rest| rest.trim().to_string()))
    };
    let rate = field("Requests/sec:")?.parse().ok()?;
    let p50 = duration(&field("50%")?)?;
    let p99 = duration(&field("99%")?)?;
    let requests = text.lines().find(|l| l.contains("requests in"))?.split_whitespace().next()?.parse().ok()?;
    let non_2xx: u64 = field("Non-2xx or 3xx responses:").and_then(|v| v.parse().ok()).unwrap_or(0);
    let failed: u64 = field("Failed calls:").and_then(|v| v.parse().ok()).unwrap_or(0);
    let socket: u64 = field("Socket errors:")
        .map(|v| v.split(',').filter_map(|p| p.split_whitespace().last()?.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    Some(Load { rate, p50, p99, requests, errors: non_2xx + socket + failed })
}

/// wrk's latency units: us, ms, s.
pub fn duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number.trim().parse().ok()?;
    let seconds = match unit.trim() {
        "us" => value / 1e6,
        "ms" => value / 1e3,
        "s" => value,
        "m" => value * 60.0,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}

pub fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
