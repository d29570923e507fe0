//! The `ctx` binary: parses the command line and hands over to the library.

fn main() -> std::process::ExitCode {
    // A stdio upstream's guard is ctx re-executed; it must start before clap and tokio. It is the
    // one ctx process without the runtime `cli::main` builds: it takes its signals with
    // `sigtimedwait` on its only thread, and a runtime's threads would take them first.
    if let Some(code) = ctx::upstream::guard::main_if_guard() {
        return code;
    }
    ctx::cli::main()
}
