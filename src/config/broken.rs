//! Sections that an unset `${VAR}` disables on their own.
//!
//! Desktop MCP clients start ctx without the shell's environment, so one tool's missing token
//! must not take every other tool, agent, connector and the search down with it. A section of
//! an [`ISOLATED`] table that references an unset variable is set aside with its problems; the
//! rest of the config loads. An unset variable anywhere else (server, db, retrieval, ...) still
//! makes the whole config invalid.

use std::path::PathBuf;

use super::{ConfigProblem, ScriptKind};

/// What an isolated section defines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SectionKind {
    /// A connector, tool or agent (a script or an inline agent).
    Script(ScriptKind),
    /// An upstream MCP server (`[mcp.servers.<name>]` or an imported `mcpServers` entry).
    Upstream,
}

/// The tables whose sections stand alone, as path segments, and what their sections define.
/// A new kind of extension section joins this list.
pub const ISOLATED: [(&str, &str, SectionKind); 5] = [
    ("connectors", "script", SectionKind::Script(ScriptKind::Connector)),
    ("tools", "script", SectionKind::Script(ScriptKind::Tool)),
    ("agents", "script", SectionKind::Script(ScriptKind::Agent)),
    ("agents", "inline", SectionKind::Script(ScriptKind::Agent)),
    ("mcp", "servers", SectionKind::Upstream),
];

/// A section of an [`ISOLATED`] table that cannot be used, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokenSection {
    pub kind: SectionKind,
    /// The table, dotted: `tools.script`, `agents.inline`, `mcp.servers`, or `mcpServers` for
    /// an entry of an imported file.
    pub table: String,
    /// The section's name in that table.
    pub name: String,
    /// The script its `path` names, absolute, when it has one (`ctx tool test PATH` finds
    /// the section by it).
    pub path: Option<PathBuf>,
    /// The config file (or the imported file), as messages show it.
    pub file: String,
    /// Its unset variables, then any other problem with its keys (a section that cannot run
    /// anyway reports everything wrong with it at once), by line.
    pub problems: Vec<ConfigProblem>,
    /// Refused outright (a pack whose files do not match `ctx.lock`): a reload drops the
    /// section's last good version instead of keeping it, since files it reads at run time
    /// (`require`d modules) are the changed ones.
    pub refused: bool,
}

impl BrokenSection {
    /// `tools.script.jira`.
    pub fn section(&self) -> String {
        format!("{}.{}", self.table, self.name)
    }

    /// One line for logs, `/health` and `ctx tool list`: the file, every problem with its key
    /// and line, and what to do.
    pub fn message(&self) -> String {
        let problems: Vec<String> = self.problems.iter().map(ToString::to_string).collect();
        // The hint only helps when a variable is missing; an imported server with another
        // problem (an "sse" type, no command) is not fixed by the environment.
        let hint = if self.problems.iter().any(|p| p.message.starts_with("environment variable")) {
            " (an MCP client that launches ctx passes it only the environment variables its own config lists)"
        } else {
            ""
        };
        format!("{}: {}; [{}] is disabled until this is fixed{hint}", self.file, problems.join("; "), self.section())
    }
}

/// The isolated section that `path` (key segments from the top of the config) lies in: the
/// index of its table in [`ISOLATED`] and the section's name.
pub fn section_of(path: &[String]) -> Option<(usize, String)> {
    let [first, second, name, ..] = path else { return None };
    ISOLATED.iter().position(|(a, b, _)| first == a && second == b).map(|i| (i, name.clone()))
}
