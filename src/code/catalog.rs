//! Discovery for code mode (seed 001's progressive discovery): the servers, one server's tools,
//! one tool's Lua signature and example, a ranked full-text search over every tool, and the
//! catalog prompt (seed 002's `system_prompt()`).
//!
//! STUB: the signatures are the contract; the bodies are being written.

use serde_json::Value as Json;

use super::names::Layout;
use crate::tools::ToolSpec;

/// Beyond this many tools the catalog prompt switches to its compact form.
pub const COMPACT_AFTER: usize = 50;

/// The tools a script can reach, described for discovery. Built from one registry snapshot
/// (and, for a scripted tool, only the tools its globs allow).
pub struct Catalog {
    layout: Layout,
}

impl Catalog {
    /// A catalog of `tools` (the tools in scope, in registry order).
    pub fn new<'a>(tools: impl IntoIterator<Item = &'a ToolSpec>) -> Catalog {
        Catalog { layout: Layout::new(tools) }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// How many tools are in scope.
    pub fn len(&self) -> usize {
        self.layout.groups.iter().map(|g| g.members.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `list_servers()`: `{"servers": [{"name", "global", "tools", "note"?}]}`, ctx first.
    pub fn list_servers(&self) -> Json {
        todo!("Catalog::list_servers")
    }

    /// `list_tools(server)`: `{"server", "tools": [{"name", "call", "summary"}]}`. The error
    /// names the known servers.
    pub fn list_tools(&self, server: &str) -> Result<Json, String> {
        let _ = server;
        todo!("Catalog::list_tools")
    }

    /// `describe_tool(name)` by registry name or call path: `{"name", "call", "signature",
    /// "description", "parameters", "output"?, "example", "annotations"?, "note"?}`. The error
    /// suggests close names.
    pub fn describe_tool(&self, name: &str) -> Result<Json, String> {
        let _ = name;
        todo!("Catalog::describe_tool")
    }

    /// `search_tools(query, limit)`: `{"query", "tools": [{"name", "call", "summary",
    /// "score"}]}`, best first, ranked by BM25 over names and descriptions.
    pub fn search_tools(&self, query: &str, limit: usize) -> Result<Json, String> {
        let _ = (query, limit);
        todo!("Catalog::search_tools")
    }

    /// The catalog prompt: every tool as a Lua signature with a one-line summary, how to call
    /// and await, and tips; one compact line per tool beyond [`COMPACT_AFTER`] tools. `title`
    /// heads it (`execute`, or a scripted tool's name).
    pub fn prompt(&self, title: &str) -> String {
        let _ = title;
        todo!("Catalog::prompt")
    }

    /// The `execute` tool's own description: short (well under 1,000 tokens) however many
    /// tools exist. It names the discovery tools and the groups with their tool counts
    /// (the first few, then how many more).
    pub fn execute_description(&self) -> String {
        todo!("Catalog::execute_description")
    }
}
