//! The guard: a tiny re-execution of ctx that sits between ctx and a stdio upstream, so that no
//! process of that upstream outlives ctx, not even when ctx is killed with SIGKILL.
//!
//! `prctl(PR_SET_PDEATHSIG)` only reaches a direct child, and `npx`/`uvx` servers run as
//! grandchildren. So ctx starts `ctx __upstream-guard <ctx-pid> <command> <args...>` instead of
//! the command. The guard:
//! - asks the kernel for SIGTERM when ctx dies (and checks `getppid()` for the race where ctx
//!   died before that request);
//! - leads a new session and process group, and is a child subreaper, so every descendant of the
//!   server is in its group or is re-parented to it;
//! - starts the real command in its group with ctx's pipes as stdin/stdout/stderr (the guard
//!   copies no bytes) and lets go of its own copies of stdin/stdout;
//! - on SIGTERM/SIGINT/SIGHUP (ctx died, or ctx is stopping the server), or when the server
//!   exits, terminates the group (SIGTERM, a short grace, then SIGKILL to whatever is left), reaps
//!   everything and exits with the server's status.
//!
//! It runs before clap and tokio (see `src/main.rs`), single-threaded, with plain syscalls.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The hidden first argument that turns `ctx` into a guard.
pub const GUARD_ARG: &str = "__upstream-guard";

/// How long the guard lets the group exit after SIGTERM before it sends SIGKILL. Shorter than
/// ctx's own grace, so that the guard finishes first and reports the server's status.
const GRACE: Duration = Duration::from_millis(1500);

/// Runs the guard when ctx was started as one; `None` for every other invocation.
pub fn main_if_guard() -> Option<ExitCode> {
    let mut args = std::env::args_os();
    args.next();
    if args.next().as_deref() != Some(std::ffi::OsStr::new(GUARD_ARG)) {
        return None;
    }
    let rest: Vec<OsString> = args.collect();
    Some(ExitCode::from(run(&rest)))
}

/// The guard's whole life. `args` = `<ctx-pid> <command> [args...]`.
fn run(args: &[OsString]) -> u8 {
    let (Some(parent), Some(command)) = (args.first().and_then(|p| p.to_str()?.parse::<i32>().ok()), args.get(1))
    else {
        eprintln!("ctx: {GUARD_ARG} is internal: ctx starts it for stdio upstream servers");
        return 2;
    };
    // SAFETY: plain syscalls on this single-threaded process, with valid arguments.
    unsafe {
        // Signals are taken synchronously with sigtimedwait, so they are blocked first: a
        // SIGTERM from ctx's death that lands before this line simply ends the guard, which
        // has started nothing yet.
        let set = signal_set(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGCHLD]);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong, 0, 0, 0);
        if libc::getppid() != parent {
            // ctx died before the request above took effect.
            return 1;
        }
        // ctx usually made us a session leader already (pre_exec); when not, become one.
        if libc::getpgrp() != libc::getpid() {
            libc::setsid();
        }
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0);
    }

    let child = {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(command);
        cmd.args(&args[2..]);
        // SAFETY: sigemptyset, sigprocmask and prctl are async-signal-safe. If the guard itself is SIGKILLed, the server
        // still gets a signal (its own children are then the guard group's to catch).
        unsafe {
            cmd.pre_exec(|| {
                // The guard's blocked signals would be inherited (std does not reset the mask),
                // and a server with SIGTERM blocked could only be stopped by SIGKILL.
                let empty = signal_set(&[]);
                libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                eprintln!("ctx: cannot start `{}`: {e}", command.to_string_lossy());
                return 127;
            }
        }
    };
    let child_pid = child.id() as i32;
    // The server holds the pipes now. Letting go of ours means ctx sees stdout's EOF as soon
    // as the server's group is gone, not when the guard exits.
    release_stdio();

    let mut status: Option<i32> = None;
    let waited = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGCHLD];
    loop {
        match wait_signal(&waited, None) {
            Some(libc::SIGCHLD) => {
                reap(child_pid, &mut status);
                if status.is_some() {
                    break;
                }
            }
            Some(_) => break,
            None => {}
        }
    }
    terminate_group(child_pid, &mut status);
    match status {
        Some(code) => code.clamp(0, 255) as u8,
        None => 1,
    }
}

/// SIGTERM to the group, a grace period, then SIGKILL to every process left in the group or
/// adopted by the guard; returns when nothing is left to reap.
fn terminate_group(child_pid: i32, status: &mut Option<i32>) {
    // SAFETY: signalling our own process group; the guard has SIGTERM blocked.
    unsafe { libc::kill(0, libc::SIGTERM) };
    let deadline = Instant::now() + GRACE;
    while !reap(child_pid, status) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        wait_signal(&[libc::SIGCHLD], Some(left));
    }
    // Whatever ignored SIGTERM. A few rounds: a process killed here may have had children
    // that the guard adopts in the meantime.
    for _ in 0..50 {
        if reap(child_pid, status) {
            return;
        }
        for pid in leftovers() {
            // SAFETY: pid is in our group or our child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        wait_signal(&[libc::SIGCHLD], Some(Duration::from_millis(20)));
    }
}

/// Reaps every exited child; records the server's status. `true` when the guard has no child
/// left.
fn reap(child_pid: i32, status: &mut Option<i32>) -> bool {
    loop {
        let mut raw = 0;
        // SAFETY: plain waitpid on any child, non-blocking.
        let pid = unsafe { libc::waitpid(-1, &mut raw, libc::WNOHANG) };
        if pid == 0 {
            return false;
        }
        if pid < 0 {
            return true; // ECHILD: nothing left
        }
        if pid == child_pid {
            let code = if libc::WIFEXITED(raw) { libc::WEXITSTATUS(raw) } else { 128 + libc::WTERMSIG(raw) };
            status.get_or_insert(code);
        }
    }
}

/// Processes still in the guard's group, or re-parented to it (a daemonising grandchild).
fn leftovers() -> Vec<i32> {
    // SAFETY: getpid/getpgrp cannot fail.
    let (me, group) = unsafe { (libc::getpid(), libc::getpgrp()) };
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter(|&pid| stat_fields(pid).is_some_and(|(ppid, pgrp)| ppid == me || pgrp == group))
        .collect()
}

/// `(ppid, pgrp)` of a process, from `/proc/<pid>/stat`.
pub(crate) fn stat_fields(pid: i32) -> Option<(i32, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?;
    if state == "Z" || state == "X" {
        return None; // dead, only waiting to be reaped
    }
    Some((rest.next()?.parse().ok()?, rest.next()?.parse().ok()?))
}

/// Points stdin and stdout at /dev/null.
fn release_stdio() {
    // SAFETY: dup2 onto the standard descriptors; the path is a valid C string.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            if null > 2 {
                libc::close(null);
            }
        }
    }
}

fn signal_set(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Waits for one of `signals` (blocked), up to `timeout`; `None` on timeout or interruption.
fn wait_signal(signals: &[libc::c_int], timeout: Option<Duration>) -> Option<libc::c_int> {
    let set = signal_set(signals);
    // SAFETY: valid set and timespec pointers.
    let sig = unsafe {
        match timeout {
            None => libc::sigwaitinfo(&set, std::ptr::null_mut()),
            Some(t) => {
                let ts = libc::timespec { tv_sec: t.as_secs() as libc::time_t, tv_nsec: t.subsec_nanos() as _ };
                libc::sigtimedwait(&set, std::ptr::null_mut(), &ts)
            }
        }
    };
    (sig > 0).then_some(sig)
}
