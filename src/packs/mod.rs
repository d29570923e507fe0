//! Tool packs: folders of Lua tools, connectors and agents with a `pack.toml` manifest, copied
//! into `packs/<name>/` from a path, a git repository or a registry, pinned file by file in
//! `ctx.lock`, and checked against it whenever a config loads.
//!
//! Installing never widens the sandbox on its own: the config sections a pack needs are printed
//! (or appended with `--write`, never replacing a section), with the hosts and variables it asks
//! for. A pack whose files no longer match the lock has its sections refused ([`enforce`]).

mod fetch;
mod files;
mod git;
mod lock;
mod manifest;
mod registry;
mod sections;
mod verify;

use std::path::PathBuf;

pub use fetch::{fetch, Origin, Source, Staged, Workspace};
pub use files::{Caps, CAPS};
pub use lock::{Lock, LOCK_FILE};
pub use manifest::{Asks, Manifest, MANIFEST};
pub use registry::{open as open_registry, search, Index, INDEX};
pub use sections::{append, render, sections_naming, Rendered, NO_HOSTS};
pub use verify::{check, enforce, Mismatch};

/// The folder next to `ctx.toml` that installed packs live in.
pub const PACKS_DIR: &str = "packs";

/// Why a pack command failed. Every message says what to do next.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// SOURCE names nothing usable.
    #[error("cannot install from {given:?}: {message}")]
    Source { given: String, message: String },
    /// A git command failed.
    #[error("git {what} failed: {message}")]
    Git { what: String, message: String },
    /// The manifest is missing or invalid.
    #[error("{file} has {} problem(s); fix the pack's manifest (see docs/packs.md):\n{}", problems.len(), bullets(problems))]
    Manifest { file: String, problems: Vec<String> },
    /// A file of the pack that ctx refuses to install.
    #[error("refused: {path}: {why}; nothing was installed")]
    Unsafe { path: String, why: String },
    /// A pack of that name is already installed.
    #[error("pack '{name}' is already installed in {folder}; `ctx tool update {name}` fetches a new version, `ctx tool remove {name}` removes it")]
    Exists { name: String, folder: String },
    /// No installed pack has that name.
    #[error("no installed pack named '{name}' (installed: {}); `ctx tool list --installed` lists them", if installed.is_empty() { "none".to_string() } else { installed.join(", ") })]
    NotInstalled { name: String, installed: Vec<String> },
    /// `ctx.lock` cannot be read or is not a lock file.
    #[error("{path}: {message}; ctx writes this file: restore it from version control, or remove the packs and install them again")]
    Lock { path: String, message: String },
    /// The registry is not configured, cannot be fetched, or has no such pack.
    #[error("{0}")]
    Registry(String),
    /// Reading or writing a file failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl PackError {
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PackError {
        let what = what.into();
        move |source| PackError::Io { what, source }
    }
}

fn bullets(items: &[String]) -> String {
    items.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n")
}

/// `path` with `.` and `..` resolved lexically (no file system access), for comparing a
/// config's script paths with a pack's folder.
pub fn normalize(path: &std::path::Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}
