//! Lua names for the tools a script can call: seed 001's sanitising rules, and the layout of
//! globals (`ctx`, one table per upstream server, `mcp[...]` by exact name).
//!
//! A name that cannot be installed (it would shadow a global a script relies on, or two names
//! sanitise to the same identifier) is left out rather than picked by order: whichever tool won
//! would depend on listing order, and a script would silently call the wrong one. Every tool
//! stays reachable through `mcp[group][tool]` by its exact name, and the `note` says so.

use std::collections::HashMap;

use crate::tools::ToolSpec;

/// The group that holds ctx's own tools (built-ins, Lua tools, scripted tools).
pub const OWN: &str = "ctx";

/// Lua 5.4's reserved words: none of them can be a field after `.` or a global.
const KEYWORDS: [&str; 22] = [
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in", "local", "nil",
    "not", "or", "repeat", "return", "then", "true", "until", "while",
];

/// Lua's base globals and standard libraries (including those the sandbox removes: a script
/// that checks `if io then` must not find a server there).
const LUA_GLOBALS: &[&str] = &[
    "string",
    "table",
    "math",
    "utf8",
    "coroutine",
    "os",
    "io",
    "debug",
    "package",
    "require",
    "load",
    "loadfile",
    "dofile",
    "pcall",
    "xpcall",
    "error",
    "assert",
    "select",
    "type",
    "tostring",
    "tonumber",
    "pairs",
    "ipairs",
    "next",
    "rawget",
    "rawset",
    "rawequal",
    "rawlen",
    "setmetatable",
    "getmetatable",
    "print",
    "collectgarbage",
    "_G",
    "_ENV",
    "_VERSION",
    "warn",
    "unpack",
];

/// The globals code mode installs in a script, plus `context` (tool chaining's global).
const CODE_GLOBALS: &[&str] =
    &["ctx", "mcp", "result", "await_all", "list_servers", "list_tools", "describe_tool", "search_tools", "context"];

/// `name` as a Lua identifier: every character outside `[A-Za-z0-9_]` becomes `_`, a leading
/// digit or a Lua keyword gets a `_` prefix (`data-server` → `data_server`, `123service` →
/// `_123service`, `goto` → `_goto`). An empty name becomes `_`.
pub fn lua_identifier(name: &str) -> String {
    let mut out: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if out.is_empty() {
        return "_".into();
    }
    if out.starts_with(|c: char| c.is_ascii_digit()) || is_keyword(&out) {
        out.insert(0, '_');
    }
    out
}

/// Whether `name` is already a Lua identifier, usable after `.` as it is.
pub fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !is_keyword(name)
}

fn is_keyword(name: &str) -> bool {
    KEYWORDS.contains(&name)
}

/// Whether a global of this name would shadow something a script relies on: Lua's own globals
/// and libraries, ctx's host APIs, and the globals code mode installs (`ctx`, `mcp`, `result`,
/// `await_all`, the discovery functions).
pub fn shadows_global(identifier: &str) -> bool {
    LUA_GLOBALS.contains(&identifier)
        || CODE_GLOBALS.contains(&identifier)
        || crate::lua::api::NAMES.contains(&identifier)
}

/// `text` as a Lua string literal (double quotes, escapes for quotes, backslashes and control
/// characters), so an upstream's odd tool name can never break the code it appears in.
pub fn lua_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("\\{b:03}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The candidate closest to `word` by edit distance, when it is close enough to be a misspelling
/// (one edit for a name of up to four characters, two for a longer one), for "did you mean".
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let allowed = if word.chars().count() <= 4 { 1 } else { 2 };
    candidates
        .into_iter()
        .filter(|c| *c != word)
        .map(|c| (edits(word, c), c))
        .filter(|(d, _)| *d <= allowed)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance, by characters, ignoring ASCII case (`Time` is a misspelt `time`).
fn edits(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().map(|c| c.to_ascii_lowercase()).collect();
    let b: Vec<char> = b.chars().map(|c| c.to_ascii_lowercase()).collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != cb)).min(above + 1).min(row[j] + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

/// `.name` when `name` reads as a plain field (an identifier that is not a global's name, so
/// the path cannot be mistaken for one), else `["name"]`.
fn index(name: &str) -> String {
    if is_identifier(name) && !shadows_global(name) {
        format!(".{name}")
    } else {
        format!("[{}]", lua_string(name))
    }
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
    ///
    /// An upstream server literally named `ctx` cannot have a group of its own (`mcp["ctx"]`
    /// is ctx's tools): its tools join [`OWN`] under their registry names (`ctx.ctx__tool`).
    pub fn new<'a>(tools: impl IntoIterator<Item = &'a ToolSpec>) -> Layout {
        let mut own: Vec<(String, String)> = Vec::new();
        let mut servers: Vec<(String, Vec<(String, String)>)> = Vec::new();
        let mut by_server: HashMap<String, usize> = HashMap::new();
        for spec in tools {
            match &spec.upstream {
                Some(origin) if origin.server != OWN => {
                    let at = *by_server.entry(origin.server.clone()).or_insert_with(|| {
                        servers.push((origin.server.clone(), Vec::new()));
                        servers.len() - 1
                    });
                    servers[at].1.push((spec.name.clone(), origin.tool.clone()));
                }
                _ => own.push((spec.name.clone(), spec.name.clone())),
            }
        }
        servers.sort_by(|a, b| a.0.cmp(&b.0));

        let mut groups = Vec::with_capacity(servers.len() + 1);
        if !own.is_empty() {
            groups.push(Group { name: OWN.into(), global: Some(OWN.into()), note: None, members: members(OWN, &own) });
        }
        let identifiers: Vec<String> = servers.iter().map(|(name, _)| lua_identifier(name)).collect();
        // Each identifier with the servers that sanitise to it (in name order).
        let mut claimed: HashMap<&str, Vec<String>> = HashMap::new();
        for (identifier, (name, _)) in identifiers.iter().zip(&servers) {
            claimed.entry(identifier).or_default().push(format!("`{name}`"));
        }
        for ((name, tools), identifier) in servers.iter().zip(&identifiers) {
            let reach = format!("mcp[{}]", lua_string(name));
            let clash = &claimed[identifier.as_str()];
            let (global, note) = if shadows_global(identifier) {
                (
                    None,
                    Some(format!(
                        "not installed as the global `{identifier}`, which would shadow Lua's or ctx's own \
                         `{identifier}`: call its tools as {reach}[\"tool\"]"
                    )),
                )
            } else if clash.len() > 1 {
                (
                    None,
                    Some(format!(
                        "not installed as a global: servers {} all become `{identifier}` in Lua; call its \
                         tools as {reach}[\"tool\"]",
                        clash.join(", ")
                    )),
                )
            } else {
                (Some(identifier.clone()), None)
            };
            let members = members(name, tools);
            groups.push(Group { name: name.clone(), global, note, members });
        }
        Layout { groups }
    }

    /// A group by its exact name (`mcp["my.api"]`) or by its global (`my_api`).
    pub fn group(&self, key: &str) -> Option<&Group> {
        self.groups
            .iter()
            .find(|g| g.name == key)
            .or_else(|| self.groups.iter().find(|g| g.global.as_deref() == Some(key)))
    }

    /// The member of `group` whose exact name or field is `key`.
    pub fn member<'g>(&self, group: &'g Group, key: &str) -> Option<&'g Member> {
        group
            .members
            .iter()
            .find(|m| m.name == key)
            .or_else(|| group.members.iter().find(|m| m.field.as_deref() == Some(key)))
    }

    /// The group and member of the tool of registry name `registry`.
    pub fn locate(&self, registry: &str) -> Option<(&Group, &Member)> {
        self.groups.iter().find_map(|g| g.members.iter().find(|m| m.registry == registry).map(|m| (g, m)))
    }

    /// How a script calls the tool of registry name `registry`: `ctx.search`,
    /// `github.search_repos`, or `mcp["string"]["tool-name"]` when a name is not installed.
    pub fn call_path(&self, registry: &str) -> Option<String> {
        let (group, member) = self.locate(registry)?;
        Some(path(group, member))
    }
}

/// The call path of `member` (see [`Layout::call_path`]).
pub(crate) fn path(group: &Group, member: &Member) -> String {
    match (&group.global, &member.field) {
        (Some(global), Some(field)) => format!("{global}.{field}"),
        _ => format!("mcp{}{}", index(&group.name), index(&member.name)),
    }
}

/// The members of group `group`, from `(registry name, exact name)` pairs: each installed as
/// its identifier unless another member of the group sanitises to the same one.
fn members(group: &str, tools: &[(String, String)]) -> Vec<Member> {
    let fields: Vec<String> = tools.iter().map(|(_, name)| lua_identifier(name)).collect();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for field in &fields {
        *count.entry(field).or_default() += 1;
    }
    let group_index = index(group);
    tools
        .iter()
        .zip(&fields)
        .map(|((registry, name), field)| {
            let collides = count[field.as_str()] > 1;
            Member {
                registry: registry.clone(),
                name: name.clone(),
                field: (!collides).then(|| field.clone()),
                note: collides.then(|| {
                    format!(
                        "not installed as `{field}`: several tools of this server become `{field}` in Lua; \
                         call it as mcp{group_index}[{}]",
                        lua_string(name)
                    )
                }),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Map};

    use super::*;
    use crate::tools::{Params, UpstreamOrigin};

    /// A tool of ctx's own (`server` None) or of an upstream server, named `<server>__<tool>`.
    fn spec(server: Option<&str>, tool: &str) -> ToolSpec {
        ToolSpec {
            name: server.map_or_else(|| tool.to_string(), |s| format!("{s}__{tool}")),
            description: format!("The {tool} tool."),
            version: None,
            builtin: false,
            params: Params::compile(json!({"type": "object"})).unwrap(),
            annotations: None,
            output_schema: None,
            script: None,
            section: None,
            hidden: false,
            upstream: server.map(|s| UpstreamOrigin { server: s.into(), tool: tool.into(), raw: Map::new() }),
            approve: false,
            long_running: false,
        }
    }

    fn layout(tools: &[(Option<&str>, &str)]) -> Layout {
        let specs: Vec<ToolSpec> = tools.iter().map(|(s, t)| spec(*s, t)).collect();
        Layout::new(&specs)
    }

    #[test]
    fn code_18_seed_names_are_sanitised() {
        assert_eq!(lua_identifier("data-server"), "data_server");
        assert_eq!(lua_identifier("my.api"), "my_api");
        assert_eq!(lua_identifier("123service"), "_123service");
        assert_eq!(lua_identifier("while"), "_while");
        assert_eq!(lua_identifier("calculator"), "calculator");
        assert_eq!(lua_identifier("already_fine_9"), "already_fine_9");
    }

    #[test]
    fn code_18_goto_is_sanitised() {
        assert_eq!(lua_identifier("goto"), "_goto");
        for keyword in KEYWORDS {
            assert_eq!(lua_identifier(keyword), format!("_{keyword}"), "{keyword}");
            assert!(!is_identifier(keyword), "{keyword}");
        }
        // Only exact keywords: `gotos` and `While` are ordinary names in Lua.
        assert_eq!(lua_identifier("gotos"), "gotos");
        assert_eq!(lua_identifier("While"), "While");
        assert_eq!(lua_identifier(""), "_");
        assert_eq!(lua_identifier("café-au-lait"), "caf__au_lait");
        assert_eq!(lua_identifier("a b/c:d"), "a_b_c_d");
        assert_eq!(lua_identifier("9"), "_9");
        for name in ["data-server", "goto", "", "é", "1-2", "x y"] {
            assert!(is_identifier(&lua_identifier(name)), "{name}");
        }
    }

    #[test]
    fn code_18_shadowing_names_are_recognised() {
        for name in [
            "string",
            "table",
            "math",
            "os",
            "io",
            "require",
            "pcall",
            "_G",
            "_ENV",
            "print",
            "type",
            "ctx",
            "mcp",
            "result",
            "await_all",
            "list_servers",
            "list_tools",
            "describe_tool",
            "search_tools",
            "json",
            "http",
            "log",
            "MCP",
            "progress",
        ] {
            assert!(shadows_global(name), "{name}");
        }
        for name in ["github", "jira", "data_server", "_123service", "String", "results"] {
            assert!(!shadows_global(name), "{name}");
        }
    }

    #[test]
    fn code_18_groups_ctx_first_then_servers_by_name() {
        let layout = layout(&[
            (Some("zeta"), "a"),
            (None, "search"),
            (Some("github"), "search_repos"),
            (None, "my-tool"),
            (Some("data-server"), "fetch_records"),
        ]);
        let names: Vec<&str> = layout.groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["ctx", "data-server", "github", "zeta"]);
        let own = &layout.groups[0];
        assert_eq!(own.global.as_deref(), Some("ctx"));
        assert_eq!(own.members[0].name, "search");
        assert_eq!(own.members[1].field.as_deref(), Some("my_tool"));
        let data = layout.group("data_server").expect("by global");
        assert_eq!(data.name, "data-server");
        assert_eq!(layout.group("data-server").unwrap().global.as_deref(), Some("data_server"));
        let member = layout.member(data, "fetch_records").unwrap();
        assert_eq!(member.registry, "data-server__fetch_records");
        assert_eq!(member.name, "fetch_records");
        assert!(layout.group("nope").is_none());
    }

    #[test]
    fn code_18_call_paths() {
        let layout = layout(&[
            (None, "search"),
            (None, "my-tool"),
            (Some("github"), "search_repos"),
            (Some("github"), "list-items"),
            (Some("github"), "list.items"),
            (Some("123service"), "while"),
            (Some("string"), "tool-name"),
            (Some("string"), "upper"),
            (Some("my-api"), "x"),
            (Some("my.api"), "x"),
        ]);
        let path = |r: &str| layout.call_path(r).unwrap();
        assert_eq!(path("search"), "ctx.search");
        assert_eq!(path("my-tool"), "ctx.my_tool");
        assert_eq!(path("github__search_repos"), "github.search_repos");
        assert_eq!(path("github__list-items"), r#"mcp.github["list-items"]"#);
        assert_eq!(path("github__list.items"), r#"mcp.github["list.items"]"#);
        assert_eq!(path("123service__while"), "_123service._while");
        assert_eq!(path("string__tool-name"), r#"mcp["string"]["tool-name"]"#);
        assert_eq!(path("string__upper"), r#"mcp["string"].upper"#);
        assert_eq!(path("my-api__x"), r#"mcp["my-api"].x"#);
        assert_eq!(path("my.api__x"), r#"mcp["my.api"].x"#);
        assert_eq!(layout.call_path("github__nope"), None);
    }

    #[test]
    fn code_18_server_named_string_or_result_is_not_a_global() {
        let layout = layout(&[(Some("string"), "tool-name"), (Some("result"), "get"), (Some("github"), "x")]);
        for name in ["string", "result"] {
            let group = layout.group(name).expect("reachable by exact name");
            assert_eq!(group.global, None, "{name}");
            let note = group.note.as_deref().unwrap();
            assert!(note.contains(&format!("mcp[\"{name}\"]")), "{note}");
            assert!(note.contains("shadow"), "{note}");
        }
        assert_eq!(layout.group("github").unwrap().global.as_deref(), Some("github"));
        assert_eq!(layout.call_path("result__get").unwrap(), r#"mcp["result"].get"#);
    }

    #[test]
    fn code_18_colliding_servers_are_both_left_out() {
        let layout = layout(&[(Some("my-api"), "a"), (Some("my.api"), "b"), (Some("other"), "c")]);
        for name in ["my-api", "my.api"] {
            let group = layout.group(name).unwrap();
            assert_eq!(group.global, None, "{name}");
            let note = group.note.as_deref().unwrap();
            assert!(note.contains("`my-api`") && note.contains("`my.api`") && note.contains("`my_api`"), "{note}");
            assert!(note.contains(&format!("mcp[\"{name}\"]")), "{note}");
        }
        // Neither wins the identifier: which one would depend on listing order.
        assert!(layout.group("my_api").is_none());
        assert_eq!(layout.group("other").unwrap().global.as_deref(), Some("other"));
    }

    #[test]
    fn code_18_colliding_tools_in_one_server_are_both_left_out() {
        let layout =
            layout(&[(Some("github"), "list-items"), (Some("github"), "list.items"), (Some("github"), "search")]);
        let group = layout.group("github").unwrap();
        assert_eq!(group.global.as_deref(), Some("github"));
        for name in ["list-items", "list.items"] {
            let member = layout.member(group, name).expect("by exact name");
            assert_eq!(member.field, None);
            let note = member.note.as_deref().unwrap();
            assert!(note.contains(&format!("mcp.github[\"{name}\"]")), "{note}");
        }
        assert!(layout.member(group, "list_items").is_none());
        let search = layout.member(group, "search").unwrap();
        assert_eq!((search.field.as_deref(), search.note.as_deref()), (Some("search"), None));
    }

    #[test]
    fn code_18_upstream_named_ctx_joins_own_tools() {
        let layout = layout(&[(None, "search"), (Some("ctx"), "x")]);
        assert_eq!(layout.groups.len(), 1);
        assert_eq!(layout.call_path("ctx__x").unwrap(), "ctx.ctx__x");
    }

    #[test]
    fn code_18_odd_names_stay_valid_lua() {
        assert_eq!(lua_string("a\"b\\c\nd"), r#""a\"b\\c\nd""#);
        assert_eq!(lua_string("\u{1}"), r#""\001""#);
        let colliding = layout(&[(Some("srv"), "we\"ird]"), (Some("srv"), "we-ird-")]);
        assert_eq!(colliding.call_path("srv__we\"ird]").unwrap(), r#"mcp.srv["we\"ird]"]"#);
        let single = layout(&[(Some("srv"), "we\"ird]")]);
        assert_eq!(single.call_path("srv__we\"ird]").unwrap(), "srv.we_ird_");
    }

    #[test]
    fn nearest_name_is_a_misspelling_within_one_or_two_edits() {
        let servers = ["ctx", "time", "memory", "github"];
        assert_eq!(nearest("tme", servers), Some("time"));
        assert_eq!(nearest("Time", servers), Some("time"));
        assert_eq!(nearest("memroy", servers), Some("memory"));
        assert_eq!(nearest("githb", servers), Some("github"));
        // Two edits on a short name are another word, not a typo.
        assert_eq!(nearest("tx", ["time"]), None);
        assert_eq!(nearest("weather", servers), None);
    }
}
