//! A closed stdout (`ctx search x --json | head -1`) ends a command quietly with status 0, as
//! it does for standard Unix tools.
//!
//! Rust ignores SIGPIPE, so a write to a pipe whose reader is gone fails with EPIPE, and
//! `println!` panics on it. SIGPIPE stays ignored (a server must never die because a client
//! closed its socket); instead the panic of such a `println!` on the main thread, where every
//! command prints, is caught in [`super::main`] and turned into a quiet exit.

use std::any::Any;

/// Keeps the panic hook from reporting a `println!` that found stdout closed; every other
/// panic is reported as before.
pub fn silence_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let on_main = std::thread::current().name() == Some("main");
        if on_main && closed_stdout(info.payload()) {
            return;
        }
        report(info);
    }));
}

/// True for the payload of a panic caught on the main thread that only says stdout was closed.
pub fn closed_stdout(payload: &(dyn Any + Send)) -> bool {
    let text = payload.downcast_ref::<String>().map(String::as_str).or_else(|| payload.downcast_ref::<&str>().copied());
    text.is_some_and(is_closed_stdout)
}

/// The message of std's `print!` family when the write failed with EPIPE.
fn is_closed_stdout(message: &str) -> bool {
    message.strip_prefix("failed printing to stdout: ").is_some_and(|why| why == broken_pipe())
}

/// EPIPE as the OS words it: "Broken pipe (os error 32)" on Linux.
fn broken_pipe() -> String {
    std::io::Error::from_raw_os_error(libc::EPIPE).to_string()
}

/// Writes `bytes` to stdout; a closed stdout is not an error (see the module docs).
pub fn write_stdout(bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_print_to_a_closed_stdout_is_quiet() {
        let closed = format!("failed printing to stdout: {}", broken_pipe());
        assert!(closed_stdout(&closed.clone()));
        assert!(!closed_stdout(&"failed printing to stderr: Broken pipe (os error 32)".to_string()));
        assert!(!closed_stdout(&"failed printing to stdout: No space left on device (os error 28)"));
        assert!(!closed_stdout(&42));
    }
}
