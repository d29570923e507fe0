//! A tool as agents see it: its spec, the names built-ins reserve, and the limit on names.

use serde_json::{Map, Value as Json};

use super::Params;
use crate::types::{ToolAnnotations, ToolInfo};

/// The longest tool name a call may give.
pub const MAX_NAME_BYTES: usize = 256;

/// Built-in tool names, in listing order. Lua tools may not take them.
pub const BUILTINS: [&str; 3] = ["search", "get", "sources"];

/// A tool as agents see it, with its compiled parameter validator.
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub version: Option<String>,
    pub builtin: bool,
    pub params: Params,
    pub annotations: Option<ToolAnnotations>,
    pub output_schema: Option<Map<String, Json>>,
    /// The script file as written in ctx.toml, for Lua tools.
    pub script: Option<String>,
    /// The `[tools.script.<section>]` key, for Lua tools.
    pub section: Option<String>,
    /// Left out of the flat listings (an upstream server with `expose = "discover"`): still
    /// callable by name.
    pub hidden: bool,
    /// Where an upstream tool comes from, with its `tools/list` entry as the server sent it.
    pub upstream: Option<UpstreamOrigin>,
    /// The tool's own script asks that every call wait for approval (`approve = true` in its
    /// `tool` table); its config section can ask too, and either is enough.
    pub approve: bool,
    /// Calls may run long: MCP clients that support tasks get a task handle (`long_running =
    /// true` in the tool table or its section; an upstream tool whose `taskSupport` is
    /// `optional` or `required`).
    pub long_running: bool,
}

/// The server and original name of an upstream tool, and its listing entry unchanged.
pub struct UpstreamOrigin {
    pub server: String,
    pub tool: String,
    pub raw: Map<String, Json>,
}

impl ToolSpec {
    /// The listing entry (`GET /tools/list`). Config values are not part of a spec, so they can
    /// never appear here.
    pub fn info(&self) -> ToolInfo {
        ToolInfo {
            name: self.name.clone(),
            description: self.description.clone(),
            builtin: self.builtin,
            version: self.version.clone(),
            parameters: self.params.schema().as_object().cloned().unwrap_or_default(),
            annotations: self.annotations.clone(),
            output_schema: self.output_schema.clone().unwrap_or_default(),
        }
    }
}
