//! `[mcp]`: the upstream MCP servers ctx connects to, resolved from `ctx.toml` and from an
//! imported Claude Desktop / Cursor style `{"mcpServers": {...}}` file.
//!
//! INTERFACE STUB (issue 17): the types below are the contract between the config layer, the
//! upstream runtime (`crate::upstream`) and the registry. Parsing fills them in.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Names passed through from ctx's own environment to every stdio child when the config does
/// not say otherwise. Nothing else of ctx's environment (its secrets) reaches an upstream.
pub const DEFAULT_PASS_ENV: [&str; 7] = ["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER"];

/// The per-call timeout of an upstream tool when its section sets none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How ctx reaches one upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpstreamTransport {
    /// A child process speaking MCP on stdin/stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        /// The child's whole environment: the section's `env` (expanded) plus the passed-through
        /// names that are set in ctx's environment. The child gets exactly this, nothing more.
        env: BTreeMap<String, String>,
        /// Absolute; `None` runs the child in the config file's folder.
        cwd: Option<PathBuf>,
    },
    /// A Streamable HTTP endpoint.
    Http { url: String, headers: BTreeMap<String, String> },
}

/// Whether a server's tools appear in the flat listings (`tools/list`, `/tools/list`,
/// `/openapi.json`, `ctx tool list`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Expose {
    /// Listed like every other tool.
    #[default]
    All,
    /// Left out of the flat listings; still callable by name and from code mode.
    Discover,
}

/// One upstream server, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct UpstreamSection {
    /// The `[mcp.servers.<name>]` key (or the imported file's `mcpServers` key).
    pub name: String,
    pub transport: UpstreamTransport,
    /// Allow globs over the upstream's own tool names; empty allows every tool.
    pub tools: Vec<String>,
    /// Deny globs, applied after `tools`.
    pub exclude: Vec<String>,
    /// Deadline of one call.
    pub timeout: Duration,
    /// `ctx serve` fails when this server cannot start.
    pub required: bool,
    /// `enabled = false` keeps the section configured but not started (state `disabled`).
    pub enabled: bool,
    pub expose: Expose,
    /// Where it was defined, as messages show it: `ctx.toml` or the imported file's path.
    pub origin: String,
}

impl UpstreamSection {
    /// Whether the upstream tool `tool` passes `tools` and `exclude`.
    pub fn allows(&self, tool: &str) -> bool {
        let matches = |globs: &[String]| {
            globs.iter().any(|g| globset::Glob::new(g).map(|g| g.compile_matcher().is_match(tool)).unwrap_or(false))
        };
        (self.tools.is_empty() || matches(&self.tools)) && !matches(&self.exclude)
    }
}
