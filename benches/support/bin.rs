//! The release `ctx` binary the benches run: what the quickstart builds and users run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `ctx` binary under test: by default the one `cargo build --release` makes, which is what
/// the quickstart runs, or `CTX_BENCH_BIN` (to measure another build of the same code).
///
/// Not the copy cargo builds for this bench: that one has the bench profile's settings, not the
/// release profile users run.
pub fn ctx_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| match std::env::var_os("CTX_BENCH_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => release_bin(),
    })
    .clone()
}

fn release_bin() -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--locked", "--bin", "ctx"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo build --release");
    assert!(status.success(), "cargo build --release failed");
    // The bench profile writes its copy to the same place; the build above has just put the
    // release one back.
    PathBuf::from(env!("CARGO_BIN_EXE_ctx"))
}

/// Starts the release `ctx serve` with `config` on a free loopback port (`extra` may add
/// arguments or environment) and waits until it listens: the child and its base URL.
pub fn serve(config: &Path, extra: impl FnOnce(&mut Command)) -> (Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
    let bind = format!("127.0.0.1:{port}");
    let mut command = Command::new(ctx_bin());
    command.arg("--config").arg(config).args(["-q", "serve", "--bind", &bind]).stdout(Stdio::null());
    extra(&mut command);
    let child = command.spawn().expect("start ctx serve");
    let started = Instant::now();
    while std::net::TcpStream::connect(&bind).is_err() {
        assert!(started.elapsed() < Duration::from_secs(20), "ctx serve did not start listening on {bind}");
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, format!("http://{bind}"))
}
