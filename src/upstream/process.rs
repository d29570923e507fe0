//! A stdio upstream's process: started in its own process group (through the guard when ctx
//! runs as its own binary), with exactly the configured environment, its stderr logged, and
//! stopped by close, SIGTERM to the group, SIGKILL to the group, and a reap.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::{ChildStdin, ChildStdout};

use super::guard::GUARD_ARG;
use super::stderr::{self, Tail};

/// What to start.
pub struct Spec<'a> {
    pub server: &'a str,
    pub command: &'a str,
    pub args: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub cwd: Option<&'a Path>,
    /// The ctx binary to run as the guard; `None` starts the command directly (in-process
    /// library tests, where the current executable is not ctx).
    pub guard: Option<&'a Path>,
}

/// A running upstream process; the group leader is `pid` (the guard, or the server itself).
pub struct Child {
    child: tokio::process::Child,
    pid: u32,
    guarded: bool,
    status: Option<ExitStatus>,
    pub tail: Tail,
}

/// The guard to use by default: ctx itself, when the current executable is ctx.
pub fn default_guard() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    (exe.file_stem()? == "ctx").then_some(exe)
}

/// Starts the process; returns it with its stdout (ctx reads) and stdin (ctx writes).
pub fn spawn(spec: &Spec<'_>) -> std::io::Result<(Child, ChildStdout, ChildStdin)> {
    let mut cmd = match spec.guard {
        Some(guard) => {
            let mut cmd = tokio::process::Command::new(guard);
            cmd.arg(GUARD_ARG).arg(std::process::id().to_string()).arg(spec.command);
            cmd
        }
        None => tokio::process::Command::new(spec.command),
    };
    cmd.args(spec.args)
        // The child's whole environment is the section's `env`: ctx's secrets stay in ctx.
        .env_clear()
        .envs(spec.env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(cwd) = spec.cwd {
        cmd.current_dir(cwd);
    }
    // The guard handles SIGTERM (it terminates the server's group); a direct child gets
    // SIGKILL, as it may ignore SIGTERM.
    let death_signal = if spec.guard.is_some() { libc::SIGTERM } else { libc::SIGKILL };
    // SAFETY: setsid, prctl, sigemptyset and pthread_sigmask are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            // Its own session and process group, so that stopping it reaches its children.
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Note: PDEATHSIG fires when the *thread* that forked exits. ctx spawns from tokio
            // worker threads, which live as long as the runtime; were one to end, the guard
            // stops the server and the supervisor starts it again.
            libc::prctl(libc::PR_SET_PDEATHSIG, death_signal as libc::c_ulong, 0, 0, 0);
            // A clean signal mask (std does not reset it): a thread of ctx may block some.
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let pid = child.id().unwrap_or(0);
    let (Some(stdout), Some(stdin), Some(err)) = (child.stdout.take(), child.stdin.take(), child.stderr.take()) else {
        return Err(std::io::Error::other("the child's pipes were not set up"));
    };
    let tail = Tail::default();
    stderr::spawn_reader(spec.server.to_string(), err, tail.clone());
    Ok((Child { child, pid, guarded: spec.guard.is_some(), status: None, tail }, stdout, stdin))
}

impl Child {
    /// The process group (and its leader's pid).
    pub fn group(&self) -> u32 {
        self.pid
    }

    /// The server's own pid: the guard's only child, or the leader itself.
    pub fn server_pid(&self) -> u32 {
        if !self.guarded {
            return self.pid;
        }
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.pid)).unwrap_or_default();
        children.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(self.pid)
    }

    /// Waits for the group leader to exit (cancel-safe).
    pub async fn exited(&mut self) -> ExitStatus {
        if let Some(status) = self.status {
            return status;
        }
        let status = match self.child.wait().await {
            Ok(status) => status,
            Err(_) => std::os::unix::process::ExitStatusExt::from_raw(0),
        };
        self.status = Some(status);
        // A direct child's group may still hold the pipes (a grandchild): end it too.
        // The pid cannot have been reused as a group id while members of the group live.
        self.signal_group(libc::SIGKILL);
        status
    }

    /// The leader's status if it has exited, without waiting.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.status = Some(status);
                self.signal_group(libc::SIGKILL);
            }
        }
        self.status
    }

    /// Stops the process after ctx closed its stdin: waits `grace`, then SIGTERM to the group,
    /// waits `grace`, then SIGKILL to the group, and reaps it.
    pub async fn stop(&mut self, grace: Duration) -> ExitStatus {
        if let Ok(status) = tokio::time::timeout(grace, self.exited()).await {
            return status;
        }
        self.signal_group(libc::SIGTERM);
        if let Ok(status) = tokio::time::timeout(grace, self.exited()).await {
            return status;
        }
        tracing::warn!(pid = self.pid, "upstream process group ignored SIGTERM; sending SIGKILL");
        self.signal_group(libc::SIGKILL);
        self.exited().await
    }

    fn signal_group(&self, signal: libc::c_int) {
        if self.pid > 0 {
            // SAFETY: signalling the process group this Child created (setsid).
            unsafe { libc::kill(-(self.pid as i32), signal) };
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // Dropped without `stop` (a cancelled connect): SIGKILL the whole group, not only the
        // leader (`kill_on_drop`); tokio reaps the leader in the background.
        if self.try_status().is_none() {
            self.signal_group(libc::SIGKILL);
        }
    }
}

/// Describes an exit status for messages: `status 3`, `signal 9`.
pub fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => status.to_string(),
    }
}
