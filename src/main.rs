//! The `ctx` binary: parses the command line and hands over to the library.

fn main() -> std::process::ExitCode {
    // A stdio upstream's guard is ctx re-executed; it must start before clap and tokio.
    if let Some(code) = ctx::upstream::guard::main_if_guard() {
        return code;
    }
    ctx::cli::main()
}
