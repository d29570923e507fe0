//! Lua names for the tools a script can call: seed 001's sanitising rules, and the layout of
//! globals (`ctx`, one table per upstream server, `mcp[...]` by exact name).
//!
//! STUB: the signatures are the contract; the bodies are being written.

use crate::tools::ToolSpec;

/// The group that holds ctx's own tools (built-ins, Lua tools, scripted tools).
pub const OWN: &str = "ctx";

/// `name` as a Lua identifier: every character outside `[A-Za-z0-9_]` becomes `_`, a leading
/// digit or a Lua keyword gets a `_` prefix (`data-server` → `data_server`, `123service` →
/// `_123service`, `goto` → `_goto`). An empty name becomes `_`.
pub fn lua_identifier(name: &str) -> String {
    let _ = name;
    todo!("names::lua_identifier")
}

/// Whether a global of this name would shadow something a script relies on: Lua's own globals
/// and libraries, ctx's host APIs, and the globals code mode installs (`ctx`, `mcp`, `result`,
/// `await_all`, the discovery functions).
pub fn shadows_global(identifier: &str) -> bool {
    let _ = identifier;
    todo!("names::shadows_global")
}

/// Where every tool in scope lives in a script's globals.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    /// [`OWN`] first (when it has tools), then the upstream servers by name.
    pub groups: Vec<Group>,
}

/// `ctx`, or one upstream server.
#[derive(Clone, Debug)]
pub struct Group {
    /// [`OWN`], or the server's configured name.
    pub name: String,
    /// The global the group is installed as; `None` when its identifier would shadow a global
    /// or collides with another group's (see `note`). It stays reachable as `mcp[name]`.
    pub global: Option<String>,
    /// Why the group is not installed as a global, for discovery.
    pub note: Option<String>,
    pub members: Vec<Member>,
}

/// One tool of a group.
#[derive(Clone, Debug)]
pub struct Member {
    /// The registry name a call goes to (`search`, `github__search_repos`).
    pub registry: String,
    /// The tool's exact name inside its group: the registry name for ctx's own tools, the
    /// upstream's own tool name for a server's.
    pub name: String,
    /// The field it is installed as in its group's table; `None` when two tools of the group
    /// sanitise to the same identifier (see `note`). It stays reachable by its exact name.
    pub field: Option<String>,
    pub note: Option<String>,
}

impl Layout {
    /// The layout of `tools` (the tools in scope, in registry order): ctx's own tools are
    /// those without an upstream origin.
    pub fn new<'a>(tools: impl IntoIterator<Item = &'a ToolSpec>) -> Layout {
        let _ = tools.into_iter().count();
        todo!("Layout::new")
    }

    /// A group by its exact name (`mcp["my.api"]`) or by its global (`my_api`).
    pub fn group(&self, key: &str) -> Option<&Group> {
        let _ = key;
        todo!("Layout::group")
    }

    /// The member of `group` whose exact name or field is `key`.
    pub fn member<'g>(&self, group: &'g Group, key: &str) -> Option<&'g Member> {
        let _ = (group, key);
        todo!("Layout::member")
    }

    /// How a script calls the tool of registry name `registry`: `ctx.search`,
    /// `github.search_repos`, or `mcp["string"]["tool-name"]` when a name is not installed.
    pub fn call_path(&self, registry: &str) -> Option<String> {
        let _ = registry;
        todo!("Layout::call_path")
    }
}
