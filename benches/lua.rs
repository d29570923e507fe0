//! Lua sandbox cost: a fresh VM with every host API and limit installed, plus a trivial call.
//!
//! Target (issue "Lua runtime"): ≤ 80 µs p50 for a fresh sandboxed VM plus a trivial call.
//! Also timed: the same call in a VM restarted for the run (new globals, same sandbox), which is
//! how tool calls run when the thread has an idle VM of the script.
//! Run: `cargo bench --bench lua`.

use std::time::{Duration, Instant};

use ctx::config::ScriptKind;
use ctx::lua::{CancelHandle, Limits, ScriptInfo, Vm};

const ITERATIONS: usize = 5000;

const SCRIPT: &str = r#"
tool = { name = "echo", description = "echo", parameters = {} }
function tool.execute(params)
  return { message = params.message, n = 1 }
end
"#;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn measure(label: &str, target: Option<Duration>, mut f: impl FnMut()) {
    for _ in 0..200 {
        f();
    }
    let mut samples: Vec<Duration> = (0..ITERATIONS)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed()
        })
        .collect();
    samples.sort();
    let p50 = percentile(&samples, 0.5);
    let verdict = match target {
        Some(t) if p50 <= t => format!("  target ≤ {:?}: PASS", t),
        Some(t) => format!("  target ≤ {:?}: MISS", t),
        None => String::new(),
    };
    println!(
        "{label:<58} p50 {:>7.1} µs  p95 {:>7.1} µs  p99 {:>7.1} µs{verdict}",
        p50.as_secs_f64() * 1e6,
        percentile(&samples, 0.95).as_secs_f64() * 1e6,
        percentile(&samples, 0.99).as_secs_f64() * 1e6,
    );
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("echo.lua");
    std::fs::write(&path, SCRIPT).expect("write script");
    let info = ScriptInfo::from_path(ScriptKind::Tool, &path);
    let limits = Limits::default_for(ScriptKind::Tool);
    println!("Lua sandbox, {ITERATIONS} iterations each (release build; 64 MiB cap, 30 s deadline, all host APIs)");

    measure("fresh VM (sandbox + all host APIs + limits)", None, || {
        let vm = Vm::new(info.clone(), limits, CancelHandle::new()).expect("vm");
        std::hint::black_box(&vm);
    });
    measure("fresh VM + load script (from memory) + execute + JSON", Some(Duration::from_micros(80)), || {
        let vm = Vm::new(info.clone(), limits, CancelHandle::new()).expect("vm");
        call_echo(&vm);
    });
    let mut reused = Some(Vm::new(info.clone(), limits, CancelHandle::new()).expect("vm"));
    measure("restarted VM + load script (bytecode) + execute + JSON", Some(Duration::from_micros(80)), || {
        let mut vm = reused.take().expect("vm");
        vm.restart(CancelHandle::new()).expect("restart");
        call_echo(&vm);
        reused = Some(vm);
    });
    measure("fresh VM + load script (from disk) + execute + JSON", None, || {
        let vm = Vm::new(info.clone(), limits, CancelHandle::new()).expect("vm");
        let ext = vm.load_extension("tool").expect("load");
        let execute = vm.function(&ext, "tool", "execute").expect("execute");
        let out = vm.call(&execute, vm.lua().create_table().expect("table")).expect("call");
        std::hint::black_box(vm.result_json(&out).expect("json"));
    });
}

/// Loads the echo script into `vm`, calls `tool.execute{message = "hi"}` and converts the result.
fn call_echo(vm: &Vm) {
    let ext = vm.load_extension_from(SCRIPT.as_bytes(), "tool").expect("load");
    let execute = vm.function(&ext, "tool", "execute").expect("execute");
    let params = vm.lua().create_table().expect("table");
    params.set("message", "hi").expect("set");
    let out = vm.call(&execute, params).expect("call");
    std::hint::black_box(vm.result_json(&out).expect("json"));
}
