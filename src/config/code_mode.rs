//! `[code_mode]` and `[tools.scripted.<name>]`: the limits and permissions of agent-sent Lua
//! scripts (the `execute` tool) and of the scripted tools an operator composes from globs.
//!
//! STUB: the shapes below are the contract between the config layer and `crate::code`.

use std::path::PathBuf;
use std::time::Duration;

/// The limits of one code-mode script run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeLimits {
    /// Wall time of the whole script, inner calls included (default 30 s).
    pub timeout: Duration,
    /// The script's own Lua memory (default 64 MiB).
    pub memory_bytes: usize,
    /// Lua VM instructions the script may execute (default 500 million).
    pub max_instructions: u64,
    /// Inner tool calls one script may start (default 100).
    pub max_calls: usize,
    /// Inner calls that may run at once against one upstream server, or against ctx's own tools
    /// (default 8). More wait their turn; time spent waiting does not count against a call's
    /// own timeout.
    pub max_concurrent: usize,
    /// Bytes of the script's result, as JSON, before it is truncated (default 1 MiB).
    pub max_output_bytes: usize,
    /// `log.*`/`print` lines one script may write (default 100).
    pub max_log_lines: u32,
}

impl Default for CodeLimits {
    fn default() -> Self {
        CodeLimits {
            timeout: Duration::from_secs(30),
            memory_bytes: 64 * 1024 * 1024,
            max_instructions: 500_000_000,
            max_calls: 100,
            max_concurrent: 8,
            max_output_bytes: 1024 * 1024,
            max_log_lines: 100,
        }
    }
}

/// `[code_mode]`, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct CodeMode {
    /// Whether `execute`, the discovery tools and the catalog prompt exist (default true).
    pub enabled: bool,
    pub limits: CodeLimits,
    /// Globs over registry tool names that count as destructive besides those annotated
    /// `destructiveHint: true`.
    pub destructive: Vec<String>,
    /// Globs over registry tool names of destructive tools code mode may call anyway.
    pub allow_destructive: Vec<String>,
    /// Host APIs agent-sent code may use: `http` needs `allow_hosts`, `env` needs `allow_env`,
    /// `fs` needs `fs_root`. All `None`: the script reaches the world only through tools.
    pub allow_hosts: Option<Vec<String>>,
    pub allow_private: bool,
    pub allow_env: Option<Vec<String>>,
    /// Absolute folder `fs.*` may read.
    pub fs_root: Option<PathBuf>,
}

impl Default for CodeMode {
    fn default() -> Self {
        CodeMode {
            enabled: true,
            limits: CodeLimits::default(),
            destructive: Vec::new(),
            allow_destructive: Vec::new(),
            allow_hosts: None,
            allow_private: false,
            allow_env: None,
            fs_root: None,
        }
    }
}

/// `[tools.scripted.<name>]`, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct ScriptedSection {
    /// The section key: the tool's name.
    pub name: String,
    pub description: String,
    /// Globs over registry tool names: the only tools that exist inside the script.
    pub tools: Vec<String>,
    /// `[code_mode]`'s limits with the section's own overrides applied.
    pub limits: CodeLimits,
}
