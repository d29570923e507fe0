//! Shared helpers: a temporary workspace and a way to run the real binary in it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_ctx");

/// The repository root (for shipped examples and tools).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A temporary folder with a `ctx.toml`.
pub struct Workspace {
    pub dir: tempfile::TempDir,
}

impl Workspace {
    pub fn new(config: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("ctx.toml"), config).expect("write ctx.toml");
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file (creating folders) relative to the workspace.
    pub fn write(&self, rel: &str, text: &str) {
        let path = self.path().join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    /// Runs `ctx --config ctx.toml <args>` inside the workspace.
    pub fn ctx(&self, args: &[&str]) -> Run {
        run_in(self.path(), &[&["--config", "ctx.toml"], args].concat())
    }

    pub fn db(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(self.path().join("data/ctx.sqlite")).expect("open db")
    }
}

/// Runs the binary in `dir` with `args`, without inheriting CTX_CONFIG.
pub fn run_in(dir: &Path, args: &[&str]) -> Run {
    let output = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env_remove("CTX_CONFIG")
        .env_remove("CTX_LOG")
        .output()
        .expect("run ctx");
    Run(output)
}

pub struct Run(pub Output);

impl Run {
    pub fn code(&self) -> i32 {
        self.0.status.code().unwrap_or(-1)
    }
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.0.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.0.stderr).into_owned()
    }
    /// Asserts exit 0 and returns stdout.
    #[track_caller]
    pub fn ok(&self) -> String {
        assert_eq!(self.code(), 0, "stdout:\n{}\nstderr:\n{}", self.stdout(), self.stderr());
        self.stdout()
    }
    /// Parses stdout as JSON after asserting success.
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.ok()).expect("stdout is JSON")
    }
}
