//! Cloning a pack's repository with the system `git`, so that nothing of the repository runs:
//! no hooks, no submodules, no filters, no prompts.
//!
//! git runs without the user's and the system's git config (`GIT_CONFIG_GLOBAL=/dev/null`,
//! `GIT_CONFIG_NOSYSTEM`): a filter driver (`.gitattributes` can name one) exists only in
//! config, so none can run, and a hooks template has nothing to copy (`--template=`). SSH keys
//! still work; HTTPS credential helpers, which live in that config, are not used.

use std::path::Path;
use std::process::Command;

use super::PackError;

/// A `git` command isolated from the user's config and the environment's repository.
fn git() -> Command {
    let mut cmd = Command::new("git");
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_TEMPLATE_DIR",
        "LANGUAGE",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("LC_ALL", "C")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_ATTR_NOSYSTEM", "1")
        .env("GIT_LFS_SKIP_SMUDGE", "1");
    cmd.args([
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "core.fsmonitor=false",
        "-c",
        "protocol.file.allow=always",
        "-c",
        "submodule.recurse=false",
        "-c",
        "advice.detachedHead=false",
        "-c",
        "init.defaultBranch=main",
    ]);
    cmd
}

fn run(mut cmd: Command, what: &str) -> Result<String, PackError> {
    let out = cmd.output().map_err(|e| PackError::Git {
        what: what.into(),
        message: if e.kind() == std::io::ErrorKind::NotFound {
            "git is not installed or not on PATH; installing from a repository runs the `git` command".into()
        } else {
            e.to_string()
        },
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Whole: git words one message over several lines ("...\nand the repository exists.").
        let lines: Vec<&str> = stderr.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        let message = if lines.is_empty() { "no message".to_string() } else { lines.join(" ") };
        return Err(PackError::Git { what: what.into(), message });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A local repository as a `file://` URL, so that a shallow clone is shallow (git ignores
/// `--depth` for plain paths, and hard-links their objects).
fn url_of(url: &str) -> String {
    if Path::new(url).is_absolute() {
        format!("file://{url}")
    } else {
        url.to_string()
    }
}

/// Clones `url` at `reference` (a branch, a tag or a commit; the default branch when `None`)
/// into `into`, which must not exist, and returns the commit checked out.
pub fn clone(url: &str, reference: Option<&str>, into: &Path) -> Result<String, PackError> {
    if url.starts_with('-') || reference.is_some_and(|r| r.starts_with('-') || r.is_empty()) {
        return Err(PackError::Source { given: url.into(), message: "a URL or ref may not start with '-'".into() });
    }
    let remote = url_of(url);
    let mut cmd = git();
    cmd.args([
        "clone",
        "--quiet",
        "--depth",
        "1",
        "--no-tags",
        "--single-branch",
        "--template=",
        "--no-recurse-submodules",
    ]);
    if let Some(reference) = reference {
        cmd.args(["--branch", reference]);
    }
    cmd.arg("--").arg(&remote).arg(into);
    let cloned = run(cmd, &format!("clone of {url}"));
    match (cloned, reference) {
        (Ok(_), _) => {}
        // `--branch` takes branches and tags; a commit is fetched on its own.
        (Err(first), Some(reference)) if looks_like_commit(reference) => {
            let _ = std::fs::remove_dir_all(into);
            fetch_commit(&remote, reference, into).map_err(|_| first)?;
        }
        (Err(PackError::Git { what, message }), Some(reference)) => {
            return Err(PackError::Git {
                what,
                message: format!("{message} (is {reference:?} a branch, tag or commit of the repository?)"),
            })
        }
        (Err(e), _) => return Err(e),
    }
    let mut cmd = git();
    cmd.arg("-C").arg(into).args(["rev-parse", "HEAD"]);
    run(cmd, "rev-parse")
}

fn looks_like_commit(reference: &str) -> bool {
    (7..=64).contains(&reference.len()) && reference.bytes().all(|b| b.is_ascii_hexdigit())
}

fn fetch_commit(remote: &str, commit: &str, into: &Path) -> Result<(), PackError> {
    let mut cmd = git();
    cmd.args(["init", "--quiet", "--template="]).arg(into);
    run(cmd, "init")?;
    let mut cmd = git();
    cmd.arg("-C").arg(into).args(["fetch", "--quiet", "--depth", "1", "--no-tags", "--no-recurse-submodules", "--"]);
    cmd.arg(remote).arg(commit);
    if run(cmd, "fetch").is_err() {
        // A short commit, or a server that serves only what a ref names: the whole history.
        let mut cmd = git();
        cmd.arg("-C").arg(into).args(["fetch", "--quiet", "--no-tags", "--no-recurse-submodules", "--"]).arg(remote);
        cmd.arg("+refs/heads/*:refs/remotes/origin/*");
        run(cmd, "fetch")?;
        let mut cmd = git();
        cmd.arg("-C").arg(into).args(["checkout", "--quiet", "--detach", commit, "--"]);
        return run(cmd, "checkout").map(|_| ());
    }
    let mut cmd = git();
    cmd.arg("-C").arg(into).args(["checkout", "--quiet", "--detach", "FETCH_HEAD", "--"]);
    run(cmd, "checkout").map(|_| ())
}
