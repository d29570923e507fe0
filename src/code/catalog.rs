//! Discovery for code mode (seed 001's progressive discovery): the servers, one server's tools,
//! one tool's Lua signature and example, a ranked full-text search over every tool, and the
//! catalog prompt (seed 002's `system_prompt()`).
//!
//! Everything here is bounded by construction: a tool with a huge schema gets a signature cut
//! with `…`, the `execute` description names at most [`DESCRIBED_GROUPS`] servers, and the
//! prompt turns compact beyond [`COMPACT_AFTER`] tools. Agents pay for every byte of it.

use std::collections::HashMap;
use std::sync::Mutex;

use rusqlite::Connection;
use serde_json::{json, Map, Value as Json};

use super::names::{self, is_identifier, lua_string, Layout, OWN};
use crate::tools::ToolSpec;
use crate::types::ToolAnnotations;

/// Beyond this many tools the catalog prompt switches to its compact form.
pub const COMPACT_AFTER: usize = 50;

/// How many servers the `execute` description names before "and N more servers".
pub const DESCRIBED_GROUPS: usize = 20;

/// The longest one-line summary, in characters.
const SUMMARY_CHARS: usize = 120;
/// The longest summary on one line of the compact prompt.
const COMPACT_SUMMARY_CHARS: usize = 60;
/// The longest rendering of a tool's parameters, and of its result, in characters.
const INPUT_CHARS: usize = 360;
const OUTPUT_CHARS: usize = 360;
/// How deep nested objects are spelled out before they read `{...}`.
const OBJECT_DEPTH: usize = 3;
/// A hard bound on recursion through schemas (unions, `$ref` chains), whatever they nest.
const NESTING: usize = 12;
/// The most properties, enum values and union variants rendered before `…`.
const PROPERTIES: usize = 16;
const VARIANTS: usize = 8;
/// The longest default value shown after `=`.
const DEFAULT_CHARS: usize = 24;
/// `search_tools` returns between 1 and this many tools.
const SEARCH_LIMIT: usize = 50;
/// How many close names an unknown name's error suggests.
const SUGGESTIONS: usize = 5;
/// Longer keys are matched by substring only: edit distance costs length × length per tool.
const EDIT_DISTANCE_CHARS: usize = 64;
/// How much of a query `search_tools` echoes back.
const ECHO_CHARS: usize = 200;
/// BM25 weights of the index's columns: a word in a tool's name says far more about what it does
/// than the same word somewhere in its description.
const RANK: &str = "bm25(tools, 10.0, 4.0, 1.0)";

/// The tools a script can reach, described for discovery. Built from one registry snapshot
/// (and, for a scripted tool, only the tools its globs allow).
pub struct Catalog {
    layout: Layout,
    /// One per tool, in layout order (ctx's tools, then each server's).
    entries: Vec<Entry>,
    by_registry: HashMap<String, usize>,
    /// The full-text index, built on the first search: most scripts never search, and a
    /// catalog is built per registry snapshot. A `Connection` is `Send` but not `Sync`, hence the
    /// mutex.
    index: Mutex<Option<Connection>>,
}

/// What discovery needs of one tool.
struct Entry {
    registry: String,
    group: String,
    /// The tool's exact name in its group.
    name: String,
    call: String,
    description: String,
    input: Json,
    output: Option<Json>,
    annotations: Option<ToolAnnotations>,
    /// Why the tool, or its server, is not installed under its Lua name.
    note: Option<String>,
}

impl Catalog {
    /// A catalog of `tools` (the tools in scope, in registry order).
    pub fn new<'a>(tools: impl IntoIterator<Item = &'a ToolSpec>) -> Catalog {
        let specs: Vec<&ToolSpec> = tools.into_iter().collect();
        let layout = Layout::new(specs.iter().copied());
        let by_name: HashMap<&str, &ToolSpec> = specs.iter().map(|s| (s.name.as_str(), *s)).collect();
        let mut entries = Vec::with_capacity(specs.len());
        for group in &layout.groups {
            for member in &group.members {
                let Some(spec) = by_name.get(member.registry.as_str()) else { continue };
                entries.push(Entry {
                    registry: member.registry.clone(),
                    group: group.name.clone(),
                    name: member.name.clone(),
                    call: names::path(group, member),
                    description: spec.description.clone(),
                    input: spec.params.schema().clone(),
                    output: spec
                        .output_schema
                        .clone()
                        .filter(|o| !o.is_empty())
                        .map(Json::Object)
                        .or_else(|| spec.builtin.then(|| crate::tools::result_schema(&spec.name).cloned()).flatten()),
                    annotations: spec.annotations.clone(),
                    note: member.note.clone().or_else(|| group.note.clone()),
                });
            }
        }
        let by_registry = entries.iter().enumerate().map(|(i, e)| (e.registry.clone(), i)).collect();
        Catalog { layout, entries, by_registry, index: Mutex::new(None) }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Whether the tool of this registry name is in scope.
    pub fn contains(&self, registry_name: &str) -> bool {
        self.by_registry.contains_key(registry_name)
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
        let servers: Vec<Json> = self
            .layout
            .groups
            .iter()
            .map(|g| {
                let mut server = json!({"name": g.name, "global": g.global, "tools": g.members.len()});
                if let Some(note) = &g.note {
                    server["note"] = json!(note);
                }
                server
            })
            .collect();
        json!({ "servers": servers })
    }

    /// `list_tools(server)`: `{"server", "tools": [{"name", "call", "summary"}]}`. The error
    /// names the known servers.
    pub fn list_tools(&self, server: &str) -> Result<Json, String> {
        let Some(group) = self.layout.group(server) else {
            let known: Vec<&str> = self.layout.groups.iter().map(|g| g.name.as_str()).collect();
            return Err(format!(
                "no server named `{}`. Known servers: {}. list_servers() lists them with their tool counts.",
                clip(server, 64),
                names_list(&known, DESCRIBED_GROUPS)
            ));
        };
        let tools: Vec<Json> = group
            .members
            .iter()
            .filter_map(|m| Some((m, self.entry(&m.registry)?)))
            .map(|(m, e)| {
                let mut tool =
                    json!({"name": e.registry, "call": e.call, "summary": summary(&e.description, SUMMARY_CHARS)});
                if let Some(note) = &m.note {
                    tool["note"] = json!(note);
                }
                tool
            })
            .collect();
        let mut out = json!({"server": group.name, "tools": tools});
        if let Some(note) = &group.note {
            out["note"] = json!(note);
        }
        Ok(out)
    }

    /// `describe_tool(name, schemas)` by registry name or call path: `{"name", "server", "call",
    /// "signature", "description", "parameters"?, "example", "annotations"?, "note"?}`, plus
    /// `"input_schema"` and `"output_schema"?` when `schemas` is set. `parameters` maps each
    /// top-level parameter to its description; the types, optionality, defaults and shapes are
    /// in the signature, so the raw schemas, which would double what the model reads, come only
    /// on request; the input schema also when the signature had to cut the parameters short
    /// (`…`), since a call needs all of them right. A result cut short (search's ends in its
    /// optional `explain`) is left to `schemas`: its 4 KB would outweigh the rest. The error
    /// suggests close names.
    ///
    /// A tool's own name inside its server (`search_repos`) works too, when only one server has
    /// a tool of that name.
    pub fn describe_tool(&self, name: &str, schemas: bool) -> Result<Json, String> {
        let Some(entry) = self.resolve(name.trim()) else {
            let close = self.suggest(name.trim());
            let hint = if close.is_empty() {
                String::new()
            } else {
                format!(" Close names: {}.", close.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", "))
            };
            return Err(format!(
                "no tool named `{}`.{hint} search_tools(query) finds tools by what they do; list_tools(server) \
                 lists a server's tools.",
                clip(name, 64)
            ));
        };
        let mut out = json!({
            "name": entry.registry,
            "server": entry.group,
            "call": entry.call,
            "signature": signature(&entry.call, &entry.input, entry.output.as_ref()),
            "description": entry.description,
        });
        // A parameter's description may sit on the definition its `$ref` points to.
        let described: Map<String, Json> = entry
            .input
            .get("properties")
            .and_then(Json::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(name, p)| {
                let target = p.get("$ref").and_then(Json::as_str).and_then(|r| resolve_ref(&entry.input, r));
                let text = p.get("description").or_else(|| target?.get("description"))?.as_str()?;
                Some((name.clone(), text.into()))
            })
            .collect();
        if !described.is_empty() {
            out["parameters"] = Json::Object(described);
        }
        out["example"] = json!(example(&entry.call, &entry.input));
        if let Some(annotations) = &entry.annotations {
            if let Ok(value) = serde_json::to_value(annotations) {
                out["annotations"] = value;
            }
        }
        if let Some(note) = &entry.note {
            out["note"] = json!(note);
        }
        if schemas || cut_short(&entry.input, INPUT_CHARS) {
            out["input_schema"] = entry.input.clone();
        }
        if let Some(output) = entry.output.as_ref().filter(|_| schemas) {
            out["output_schema"] = output.clone();
        }
        Ok(out)
    }

    /// `search_tools(query, limit)`: `{"query", "tools": [{"name", "call", "summary",
    /// "score"}]}`, best first, ranked by BM25 over names and descriptions.
    ///
    /// Any text is a valid query: it is cut into words the way the knowledge base's search cuts
    /// them, each word quoted, and a tool matching any of them is a hit (so a question such as
    /// "create a jira ticket" works). A query without a word returns no tools and a `message`.
    pub fn search_tools(&self, query: &str, limit: usize) -> Result<Json, String> {
        let limit = limit.clamp(1, SEARCH_LIMIT);
        let echo = clip(query, ECHO_CHARS);
        let Some(fts) = crate::kb::query::fts_query(query) else {
            return Ok(json!({
                "query": echo,
                "tools": [],
                "message": "the query has no words to search for: describe what the tool should do, for example \
                            search_tools(\"create issue\")",
            }));
        };
        let expression = fts.any.unwrap_or(fts.all);
        let mut index = self.index.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if index.is_none() {
            *index =
                Some(build_index(&self.entries).map_err(|e| format!("search_tools could not index the tools: {e}"))?);
        }
        let Some(conn) = index.as_ref() else { return Err("search_tools has no index".into()) };
        let hits = rank(conn, &expression, limit).map_err(|e| format!("search_tools failed: {e}"))?;
        let tools: Vec<Json> = hits
            .into_iter()
            .filter_map(|(row, score)| {
                let e = self.entries.get(row)?;
                Some(json!({
                    "name": e.registry,
                    "call": e.call,
                    "summary": summary(&e.description, SUMMARY_CHARS),
                    "score": (score * 1000.0).round() / 1000.0,
                }))
            })
            .collect();
        let mut out = json!({"query": echo, "tools": tools});
        if out["tools"].as_array().is_some_and(|t| t.is_empty()) {
            out["message"] = json!("no tool matches: try other words, or list_servers() and list_tools(server)");
        }
        Ok(out)
    }

    /// The catalog prompt: every tool as a Lua signature with a one-line summary, how to call
    /// and await, and tips; one compact line per tool beyond [`COMPACT_AFTER`] tools. `title`
    /// heads it (`execute`, or a scripted tool's name).
    pub fn prompt(&self, title: &str) -> String {
        let compact = self.len() > COMPACT_AFTER;
        let mut out = String::new();
        out.push_str(&format!("# {title}\n\n"));
        out.push_str(&format!(
            "Run a Lua 5.4 script that calls tools: {} in {}. Only what the script returns reaches you.\n\n",
            plural(self.len(), "tool"),
            plural(self.layout.groups.len(), "server"),
        ));
        out.push_str("## How to call\n\n");
        out.push_str(&format!(
            "- `{}`: a call returns a pending call; `:await()` gives its result as a Lua table (or string).\n",
            self.sample_call()
        ));
        out.push_str(
            "- Return with `result(value)` or `return value`. Do not name a local `result`: it hides the function.\n\
             - Calls start when made: start several before awaiting any and they run concurrently; \
             `await_all({a, b})` awaits a list of pending calls and returns their results in order.\n\
             - A failed call raises an error: `local ok, err = pcall(function() return x.y({}):await() end)`; \
             `err.tool` and `err.message` say which call failed and why.\n\n",
        );
        for group in &self.layout.groups {
            out.push_str(&format!("## {} ({})\n\n", group.name, plural(group.members.len(), "tool")));
            if let Some(note) = &group.note {
                out.push_str(&format!("Note: {note}.\n\n"));
            }
            for member in &group.members {
                let Some(e) = self.entry(&member.registry) else { continue };
                if compact {
                    out.push_str(&format!("- `{}`: {}\n", e.call, summary(&e.description, COMPACT_SUMMARY_CHARS)));
                } else {
                    out.push_str(&format!("- `{}`\n", signature(&e.call, &e.input, e.output.as_ref())));
                    out.push_str(&format!("  {}\n", summary(&e.description, SUMMARY_CHARS)));
                    if let Some(note) = &member.note {
                        out.push_str(&format!("  Note: {note}.\n"));
                    }
                }
            }
            out.push('\n');
        }
        if compact {
            out.push_str(
                "Signatures are left out at this size: `describe_tool(name)` gives a tool's signature and an \
                 example, `search_tools(query)` finds tools by what they do.\n\n",
            );
        }
        out.push_str(
            "## Tips\n\n\
             - Discover inside the script: `list_servers()`, `list_tools(server)`, `describe_tool(name)` \
             (`describe_tool(name, true)` adds the raw JSON Schemas), `search_tools(query)`.\n\
             - A name that is not a Lua identifier, or that would shadow a global, is reached by its exact name: \
             `mcp[\"server\"][\"tool-name\"]`.\n\
             - Filter and join data in the script and return only what you need: intermediate results never \
             reach you.\n\
             - Parameters are one Lua table with the names the signature shows; `?` marks an optional one.\n",
        );
        out
    }

    /// The `execute` tool's own description: short (well under 1,000 tokens) however many
    /// tools exist. It names the discovery tools and the groups with their tool counts
    /// (the first few, then how many more).
    pub fn execute_description(&self) -> String {
        // Every byte here reaches the model in every session: keep it lean, and say nothing of
        // upstream servers when there are none.
        let upstream = if self.layout.groups.iter().any(|g| g.name != OWN) {
            "; upstream ones: `server.tool({...}):await()` or `mcp[\"server\"][\"tool\"]`"
        } else {
            ""
        };
        let mut out = format!(
            "Run a Lua 5.4 script that calls tools in one round trip; only what it returns reaches you. \
             ctx's own tools: `ctx.search({{query = \"...\"}}):await().results`{upstream}. Calls started before \
             awaiting run concurrently: `await_all({{a, b}})`. `return value` or `result(value)`; `pcall` catches a \
             failed call. Discover with search_tools, list_servers, list_tools, describe_tool (also in scripts).\n"
        );
        let groups: Vec<String> = self
            .layout
            .groups
            .iter()
            .take(DESCRIBED_GROUPS)
            .map(|g| format!("{} ({})", clip(&g.name, 40), g.members.len()))
            .collect();
        out.push_str(&format!("Servers ({}): {}", plural(self.len(), "tool"), groups.join(", ")));
        let more = self.layout.groups.len().saturating_sub(DESCRIBED_GROUPS);
        if more > 0 {
            out.push_str(&format!(", and {more} more {}", if more == 1 { "server" } else { "servers" }));
        }
        if groups.is_empty() {
            out.push_str("none");
        }
        out.push('.');
        out
    }

    fn entry(&self, registry: &str) -> Option<&Entry> {
        self.by_registry.get(registry).and_then(|&i| self.entries.get(i))
    }

    /// The call `prompt` shows as its first example: preferably an upstream tool (the form most
    /// calls take) with a required parameter (so it shows how arguments are written).
    fn sample_call(&self) -> String {
        let has_args = |e: &&Entry| e.input.get("required").and_then(Json::as_array).is_some_and(|r| !r.is_empty());
        let entry = self
            .entries
            .iter()
            .filter(|e| e.group != OWN)
            .find(has_args)
            .or_else(|| self.entries.iter().find(has_args))
            .or_else(|| self.entries.iter().find(|e| e.group != OWN))
            .or_else(|| self.entries.first());
        match entry {
            Some(e) => example(&e.call, &e.input),
            None => "local r = github.search_repos({query = \"rust\"}):await()".into(),
        }
    }

    /// The tool `key` names: a registry name, a call path, or (when only one tool has it) a
    /// tool's own name or Lua field.
    fn resolve(&self, key: &str) -> Option<&Entry> {
        if let Some(e) = self.entry(key) {
            return Some(e);
        }
        if let Some(e) = self.entries.iter().find(|e| e.call == key) {
            return Some(e);
        }
        if let Some(e) = self.resolve_path(key) {
            return Some(e);
        }
        fn unique(matches: Vec<&Entry>) -> Option<&Entry> {
            if matches.len() == 1 {
                matches.first().copied()
            } else {
                None
            }
        }
        unique(self.entries.iter().filter(|e| e.name == key).collect()).or_else(|| {
            let by_field = self
                .layout
                .groups
                .iter()
                .flat_map(|g| &g.members)
                .filter(|m| m.field.as_deref() == Some(key))
                .filter_map(|m| self.entry(&m.registry))
                .collect();
            unique(by_field)
        })
    }

    /// A call path in any spelling a script could use: `github.search_repos`,
    /// `mcp["my.api"]["x"]`, `mcp.github.search_repos`, `my.api.x`.
    fn resolve_path(&self, key: &str) -> Option<&Entry> {
        let find = |group: &str, member: &str| {
            let g = self.layout.group(group)?;
            let m = self.layout.member(g, member)?;
            self.entry(&m.registry)
        };
        if let Some(parts) = path_segments(key) {
            let parts: Vec<&str> = match parts.first().map(String::as_str) {
                Some("mcp") if parts.len() == 3 => parts[1..].iter().map(String::as_str).collect(),
                _ => parts.iter().map(String::as_str).collect(),
            };
            if let [group, member] = parts[..] {
                if let Some(e) = find(group, member) {
                    return Some(e);
                }
            }
        }
        // Server names may hold dots themselves (`my.api`): try every split.
        let key = key.strip_prefix("mcp.").unwrap_or(key);
        key.match_indices('.').find_map(|(at, _)| find(&key[..at], &key[at + 1..]))
    }

    /// Up to [`SUGGESTIONS`] registry names close to `key`: containing it (or contained in it)
    /// first, then by edit distance.
    fn suggest(&self, key: &str) -> Vec<String> {
        let key = key.to_lowercase();
        if key.is_empty() {
            return Vec::new();
        }
        let key_chars: Vec<char> = key.chars().collect();
        let threshold = (key_chars.len() / 3).max(2);
        let mut scored: Vec<(usize, &str)> = Vec::new();
        for e in &self.entries {
            let best = [e.registry.as_str(), e.name.as_str(), e.call.as_str()]
                .iter()
                .filter_map(|candidate| {
                    let candidate = candidate.to_lowercase();
                    if candidate.contains(&key) || (candidate.len() >= 3 && key.contains(&candidate)) {
                        return Some(0);
                    }
                    if key_chars.len() > EDIT_DISTANCE_CHARS {
                        return None;
                    }
                    let c: Vec<char> = candidate.chars().collect();
                    if c.len().abs_diff(key_chars.len()) > threshold {
                        return None;
                    }
                    Some(edit_distance(&key_chars, &c)).filter(|d| *d <= threshold).map(|d| d + 1)
                })
                .min();
            if let Some(score) = best {
                scored.push((score, &e.registry));
            }
        }
        scored.sort();
        scored.into_iter().take(SUGGESTIONS).map(|(_, name)| name.to_string()).collect()
    }
}

/// The in-memory FTS5 index of `entries`, rowid = entry index. The tokenizer is the knowledge
/// base's with English stemming (tool descriptions are English, and "documents" should find
/// "document"), so `fts_query` cuts a query into the same terms and FTS5 stems them alike.
fn build_index(entries: &[Entry]) -> rusqlite::Result<Connection> {
    let conn = Connection::open_in_memory()?;
    conn.execute_batch(
        "CREATE VIRTUAL TABLE tools USING fts5(name, grp, description, tokenize = 'porter unicode61 remove_diacritics 2')",
    )?;
    let tx = conn.unchecked_transaction()?;
    {
        let mut insert = tx.prepare("INSERT INTO tools (rowid, name, grp, description) VALUES (?1, ?2, ?3, ?4)")?;
        for (i, e) in entries.iter().enumerate() {
            // The registry name adds nothing: it is the group's name and the tool's.
            insert.execute(rusqlite::params![i as i64, words(&e.name), words(&e.group), e.description])?;
        }
    }
    tx.commit()?;
    Ok(conn)
}

/// The best `limit` rows for `expression`, each with a score (higher is better).
fn rank(conn: &Connection, expression: &str, limit: usize) -> rusqlite::Result<Vec<(usize, f64)>> {
    let sql = format!("SELECT rowid, {RANK} AS s FROM tools WHERE tools MATCH ?1 ORDER BY s, rowid LIMIT ?2");
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map(rusqlite::params![expression, limit as i64], |row| {
        Ok((row.get::<_, i64>(0)? as usize, -row.get::<_, f64>(1)?))
    })?;
    rows.collect()
}

/// A name as separate words, so a search for one word finds it: splits on anything but letters
/// and digits and at camelCase boundaries (`searchRepos` → `search Repos`, `HTTPServer` →
/// `HTTP Server`). The unsplit name is kept too when camelCase split it, for exact searches.
fn words(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 8);
    let mut camel = false;
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_alphanumeric() {
            out.push(' ');
            continue;
        }
        if i > 0 && c.is_uppercase() {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            if prev.is_lowercase() || prev.is_ascii_digit() || (prev.is_uppercase() && next_lower) {
                out.push(' ');
                camel = true;
            }
        }
        out.push(c);
    }
    if camel {
        out.push(' ');
        out.push_str(name);
    }
    out
}

/// The first sentence (or line) of `description`, at most `max` characters.
pub fn summary(description: &str, max: usize) -> String {
    let line = description.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    let mut end = line.len();
    for (at, c) in line.char_indices() {
        // A sentence ends at `. ` before a capital: "e.g. a file" goes on.
        let rest = &line[at + c.len_utf8()..];
        let next = rest.trim_start().chars().next();
        if matches!(c, '.' | '!' | '?')
            && rest.starts_with(char::is_whitespace)
            && next.is_some_and(|n| n.is_uppercase() || n.is_ascii_digit() || !n.is_alphabetic())
        {
            end = at + 1;
            break;
        }
    }
    clip(&line[..end], max)
}

/// `text` cut to `max` characters, ending in `…` when cut.
fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some(_) => {
            let keep: String = text.chars().take(max.saturating_sub(1)).collect();
            format!("{}…", keep.trim_end())
        }
    }
}

fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// `names` joined, the first `max` of them, then how many more.
fn names_list(names: &[&str], max: usize) -> String {
    if names.is_empty() {
        return "none".into();
    }
    let mut out: Vec<String> = names.iter().take(max).map(|n| format!("`{n}`")).collect();
    if names.len() > max {
        out.push(format!("and {} more", names.len() - max));
    }
    out.join(", ")
}

/// The Levenshtein distance between `a` and `b`.
fn edit_distance(a: &[char], b: &[char]) -> usize {
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        current[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitute.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

/// The segments of a Lua path (`a.b`, `a["b"]`, `mcp['a'].b`), or `None` if `text` is not one.
fn path_segments(text: &str) -> Option<Vec<String>> {
    let chars: Vec<char> = text.chars().collect();
    let mut parts = Vec::new();
    let mut i = 0;
    let ident = |i: &mut usize| {
        let start = *i;
        while *i < chars.len() && (chars[*i].is_ascii_alphanumeric() || chars[*i] == '_') {
            *i += 1;
        }
        (*i > start).then(|| chars[start..*i].iter().collect::<String>())
    };
    parts.push(ident(&mut i)?);
    while i < chars.len() {
        match chars[i] {
            '.' => {
                i += 1;
                parts.push(ident(&mut i)?);
            }
            '[' => {
                let quote = *chars.get(i + 1)?;
                if quote != '"' && quote != '\'' {
                    return None;
                }
                i += 2;
                let mut part = String::new();
                loop {
                    let c = *chars.get(i)?;
                    i += 1;
                    match c {
                        '\\' => {
                            part.push(*chars.get(i)?);
                            i += 1;
                        }
                        c if c == quote => break,
                        c => part.push(c),
                    }
                }
                if chars.get(i) != Some(&']') {
                    return None;
                }
                i += 1;
                parts.push(part);
            }
            _ => return None,
        }
    }
    Some(parts)
}

/// The Lua call signature of a tool: `github.search_repos({query: string, per_page?: integer =
/// 30}) -> {total_count: integer, items: {...}[]}`. Parameters and result are each bounded
/// ([`INPUT_CHARS`], [`OUTPUT_CHARS`]) and cut with `…`.
pub fn signature(call: &str, input: &Json, output: Option<&Json>) -> String {
    let mut out = format!("{call}(");
    let mut params = Render::new(input, INPUT_CHARS);
    params.schema(input, 0, 0);
    out.push_str(&params.finish());
    out.push(')');
    if let Some(output) = output {
        let mut result = Render::new(output, OUTPUT_CHARS);
        result.schema(output, 0, 0);
        out.push_str(" -> ");
        out.push_str(&result.finish());
    }
    out
}

/// Whether rendering `schema` within `limit` leaves something out with `…` (the budget, or
/// more properties, enum values or variants than are shown). Objects nested past
/// [`OBJECT_DEPTH`] (`{...}`) do not count: their fields are a level down, not missing.
fn cut_short(schema: &Json, limit: usize) -> bool {
    let mut render = Render::new(schema, limit);
    render.schema(schema, 0, 0);
    render.finish().contains('…')
}

/// Renders a JSON Schema as a Lua-ish type within a character budget. Once the budget is spent
/// nothing more is rendered (nor visited), so a huge schema costs as little as a small one.
struct Render<'a> {
    root: &'a Json,
    out: String,
    limit: usize,
    cut: bool,
}

impl<'a> Render<'a> {
    fn new(root: &'a Json, limit: usize) -> Render<'a> {
        Render { root, out: String::new(), limit, cut: false }
    }

    fn finish(mut self) -> String {
        if self.cut {
            self.out.push('…');
        }
        self.out
    }

    fn push(&mut self, text: &str) {
        if self.cut {
            return;
        }
        if self.out.len() + text.len() <= self.limit {
            self.out.push_str(text);
            return;
        }
        let mut end = self.limit.saturating_sub(self.out.len()).min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.out.push_str(&text[..end]);
        self.cut = true;
    }

    /// `depth` counts nested objects and arrays (shown up to [`OBJECT_DEPTH`]); `nesting` counts
    /// every step, unions and references included (bounded by [`NESTING`]).
    fn schema(&mut self, schema: &'a Json, depth: usize, nesting: usize) {
        if self.cut {
            return;
        }
        let Json::Object(s) = schema else {
            self.push(if schema == &Json::Bool(false) { "never" } else { "any" });
            return;
        };
        if nesting > NESTING {
            self.push("any");
            return;
        }
        if let Some(reference) = s.get("$ref").and_then(Json::as_str) {
            match resolve_ref(self.root, reference) {
                Some(target) => self.schema(target, depth, nesting + 1),
                None => self.push("any"),
            }
            return;
        }
        if let Some(value) = s.get("const") {
            self.push(&literal(value));
            return;
        }
        if let Some(Json::Array(values)) = s.get("enum") {
            let shown: Vec<String> = values.iter().take(VARIANTS).map(literal).collect();
            self.push(&shown.join("|"));
            if values.len() > VARIANTS {
                self.push("|…");
            }
            return;
        }
        for key in ["oneOf", "anyOf"] {
            if let Some(Json::Array(variants)) = s.get(key) {
                self.union(variants, "|", depth, nesting);
                return;
            }
        }
        if let Some(Json::Array(parts)) = s.get("allOf") {
            self.union(parts, "&", depth, nesting);
            return;
        }
        match s.get("type") {
            Some(Json::String(t)) => self.typed(t, s, depth, nesting),
            Some(Json::Array(types)) => {
                let types: Vec<&str> = types.iter().filter_map(Json::as_str).collect();
                if types.is_empty() {
                    self.push("any");
                }
                for (i, t) in types.iter().enumerate() {
                    if i > 0 {
                        self.push("|");
                    }
                    self.typed(t, s, depth, nesting);
                }
            }
            _ if s.contains_key("properties") => self.typed("object", s, depth, nesting),
            _ if s.contains_key("items") => self.typed("array", s, depth, nesting),
            _ => self.push("any"),
        }
    }

    fn union(&mut self, variants: &'a [Json], separator: &str, depth: usize, nesting: usize) {
        if variants.is_empty() {
            self.push("any");
        }
        for (i, variant) in variants.iter().take(VARIANTS).enumerate() {
            if i > 0 {
                self.push(separator);
            }
            self.schema(variant, depth, nesting + 1);
        }
        if variants.len() > VARIANTS {
            self.push(separator);
            self.push("…");
        }
    }

    fn typed(&mut self, t: &str, s: &'a Map<String, Json>, depth: usize, nesting: usize) {
        match t {
            "string" | "integer" | "number" | "boolean" => self.push(t),
            "null" => self.push("nil"),
            "array" => {
                match s.get("items") {
                    Some(items @ Json::Object(_)) if depth < OBJECT_DEPTH => {
                        let wrap = is_union(items);
                        if wrap {
                            self.push("(");
                        }
                        self.schema(items, depth + 1, nesting + 1);
                        if wrap {
                            self.push(")");
                        }
                    }
                    Some(Json::Object(_)) => self.push("{...}"),
                    _ => self.push("any"),
                }
                self.push("[]");
            }
            "object" => self.object(s, depth, nesting),
            _ => self.push("any"),
        }
    }

    fn object(&mut self, s: &'a Map<String, Json>, depth: usize, nesting: usize) {
        let properties = s.get("properties").and_then(Json::as_object).filter(|p| !p.is_empty());
        let Some(properties) = properties else {
            match s.get("additionalProperties") {
                Some(values @ Json::Object(_)) if depth < OBJECT_DEPTH => {
                    self.push("{[string]: ");
                    self.schema(values, depth + 1, nesting + 1);
                    self.push("}");
                }
                // The parameters of a tool that takes none: it is called with `{}`.
                _ if depth == 0 => self.push("{}"),
                _ => self.push("table"),
            }
            return;
        };
        if depth >= OBJECT_DEPTH {
            self.push("{...}");
            return;
        }
        let required: Vec<&str> = s
            .get("required")
            .and_then(Json::as_array)
            .map(|r| r.iter().filter_map(Json::as_str).collect())
            .unwrap_or_default();
        self.push("{");
        for (i, (key, schema)) in properties.iter().take(PROPERTIES).enumerate() {
            if i > 0 {
                self.push(", ");
            }
            if is_identifier(key) {
                self.push(key);
            } else {
                self.push(&format!("[{}]", lua_string(key)));
            }
            if !required.contains(&key.as_str()) {
                self.push("?");
            }
            self.push(": ");
            self.schema(schema, depth + 1, nesting + 1);
            if let Some(default) = schema.get("default") {
                let shown = clip(&literal(default), DEFAULT_CHARS);
                self.push(&format!(" = {shown}"));
            }
        }
        if properties.len() > PROPERTIES {
            self.push(", …");
        }
        self.push("}");
    }
}

/// Whether `schema` renders as several alternatives (and needs parentheses before `[]`).
fn is_union(schema: &Json) -> bool {
    let many = |key: &str| schema.get(key).and_then(Json::as_array).is_some_and(|a| a.len() > 1);
    many("enum") || many("oneOf") || many("anyOf") || many("type")
}

/// A local `$ref` (`#`, `#/$defs/x`, `#/definitions/x`) in `root`; `None` for anything else.
fn resolve_ref<'a>(root: &'a Json, reference: &str) -> Option<&'a Json> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        return Some(root);
    }
    root.pointer(pointer)
}

/// A JSON value as a literal in a signature: strings quoted, tables shown as `{...}`.
fn literal(value: &Json) -> String {
    match value {
        Json::String(s) => lua_string(&clip(s, 40)),
        Json::Null => "nil".into(),
        Json::Array(a) if a.is_empty() => "{}".into(),
        Json::Object(o) if o.is_empty() => "{}".into(),
        Json::Array(_) | Json::Object(_) => "{...}".into(),
        other => other.to_string(),
    }
}

/// An example call of a tool: `local r = github.search_repos({query = "..."}):await()`, with a
/// placeholder for every required parameter.
pub fn example(call: &str, input: &Json) -> String {
    let properties = input.get("properties").and_then(Json::as_object);
    let required: Vec<&str> = input
        .get("required")
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    let args: Vec<String> = required
        .iter()
        .take(PROPERTIES)
        .map(|key| {
            let schema = properties.and_then(|p| p.get(*key)).unwrap_or(&Json::Null);
            let key = if is_identifier(key) { key.to_string() } else { format!("[{}]", lua_string(key)) };
            format!("{key} = {}", placeholder(input, schema, 0))
        })
        .collect();
    let args = if args.is_empty() { "{}".to_string() } else { format!("{{{}}}", args.join(", ")) };
    format!("local r = {call}({}):await()", clip(&args, INPUT_CHARS))
}

/// A Lua value that fits `schema`, for an example: its first enum value or its const, else a
/// placeholder of its type.
fn placeholder(root: &Json, schema: &Json, nesting: usize) -> String {
    if nesting > NESTING {
        return "\"...\"".into();
    }
    if let Some(target) = schema.get("$ref").and_then(Json::as_str).and_then(|r| resolve_ref(root, r)) {
        return placeholder(root, target, nesting + 1);
    }
    if let Some(value) = schema.get("const") {
        return example_literal(value);
    }
    if let Some(first) = schema.get("enum").and_then(Json::as_array).and_then(|e| e.first()) {
        return example_literal(first);
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(first) = schema.get(key).and_then(Json::as_array).and_then(|v| v.first()) {
            return placeholder(root, first, nesting + 1);
        }
    }
    let t = match schema.get("type") {
        Some(Json::String(t)) => t.as_str(),
        Some(Json::Array(types)) => types.iter().filter_map(Json::as_str).find(|t| *t != "null").unwrap_or("null"),
        _ if schema.get("properties").is_some() => "object",
        _ => "string",
    };
    match t {
        "integer" | "number" => "1".into(),
        "boolean" => "true".into(),
        "array" | "object" => "{}".into(),
        "null" => "nil".into(),
        _ => "\"...\"".into(),
    }
}

/// A JSON value as Lua source, for an example (tables left empty: the example only shows shape).
fn example_literal(value: &Json) -> String {
    match value {
        Json::String(s) => lua_string(&clip(s, 40)),
        Json::Null => "nil".into(),
        Json::Array(_) | Json::Object(_) => "{}".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Map};

    use super::*;
    use crate::tools::{Params, UpstreamOrigin};

    /// A tool of ctx's own (`server` None) or of an upstream server, named `<server>__<tool>`.
    fn tool(server: Option<&str>, name: &str, description: &str, params: Json, output: Option<Json>) -> ToolSpec {
        ToolSpec {
            name: server.map_or_else(|| name.to_string(), |s| format!("{s}__{name}")),
            description: description.into(),
            version: None,
            builtin: false,
            params: Params::compile(params).unwrap(),
            annotations: None,
            output_schema: output.and_then(|o| o.as_object().cloned()),
            script: None,
            section: None,
            hidden: false,
            upstream: server.map(|s| UpstreamOrigin { server: s.into(), tool: name.into(), raw: Map::new() }),
            approve: false,
            long_running: false,
        }
    }

    fn simple(server: Option<&str>, name: &str, description: &str) -> ToolSpec {
        tool(server, name, description, json!({"type": "object"}), None)
    }

    fn search_repos() -> ToolSpec {
        tool(
            Some("github"),
            "search_repos",
            "Search GitHub repositories. Returns the best matches first.",
            json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "GitHub search syntax."},
                    "per_page": {"type": "integer", "default": 30},
                    "sort": {"enum": ["stars", "forks"]}
                },
                "required": ["query"]
            }),
            Some(json!({
                "type": "object",
                "properties": {
                    "total_count": {"type": "integer"},
                    "items": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}}
                },
                "required": ["total_count", "items"]
            })),
        )
    }

    /// A realistic mix of servers, for search and discovery.
    fn fixture() -> Vec<ToolSpec> {
        vec![
            simple(None, "search", "Search the knowledge base for passages that match a query."),
            simple(None, "get", "Get one document of the knowledge base by id."),
            simple(None, "sources", "List the knowledge base's sources."),
            search_repos(),
            simple(Some("github"), "create_issue", "Create an issue in a GitHub repository."),
            simple(Some("github"), "listPullRequests", "List the pull requests of a repository."),
            simple(Some("jira"), "create_issue", "Create a Jira issue (a ticket) in a project."),
            simple(Some("jira"), "search_issues", "Search Jira issues with JQL."),
            simple(Some("jira"), "get_issue", "Get one Jira issue by key."),
            simple(Some("slack"), "post_message", "Post a message to a Slack channel."),
            simple(Some("confluence"), "create_page", "Create a Confluence page in a space."),
            simple(Some("string"), "tool-name", "A tool on a server whose name shadows Lua's string library."),
        ]
    }

    fn catalog() -> Catalog {
        Catalog::new(&fixture())
    }

    #[test]
    fn code_18_catalog_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Catalog>();
    }

    #[test]
    fn code_18_signature_renders_enum_optional_default_and_output() {
        let spec = search_repos();
        let output = spec.output_schema.clone().map(Json::Object);
        assert_eq!(
            signature("github.search_repos", spec.params.schema(), output.as_ref()),
            r#"github.search_repos({query: string, per_page?: integer = 30, sort?: "stars"|"forks"}) -> {total_count: integer, items: {name?: string}[]}"#
        );
        assert_eq!(signature("ctx.sources", &json!({"type": "object"}), None), "ctx.sources({})");
    }

    #[test]
    fn code_18_signature_renders_nested_unions_refs_and_maps() {
        let schema = json!({
            "type": "object",
            "$defs": {"user": {"type": "object", "properties": {"login": {"type": "string"}}, "required": ["login"]}},
            "properties": {
                "a": {"type": "object", "properties": {"b": {"type": "object", "properties": {"c": {"type": "object", "properties": {"d": {"type": "string"}}}}}}},
                "ids": {"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "integer"}]}},
                "maybe": {"type": ["string", "null"]},
                "kind": {"const": "x"},
                "user": {"$ref": "#/$defs/user"},
                "remote": {"$ref": "https://example.com/schema.json"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "x-trace": {"type": "boolean"},
                "tags": {"type": "array"},
                "either": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "number"}}]}
            },
            "required": ["a"]
        });
        assert_eq!(
            signature("s.t", &schema, None),
            concat!(
                r#"s.t({a: {b?: {c?: {...}}}, ids?: (string|integer)[], maybe?: string|nil, kind?: "x", "#,
                r#"user?: {login: string}, remote?: any, labels?: {[string]: string}, ["x-trace"]?: boolean, "#,
                r#"tags?: any[], either?: string|number[]})"#
            )
        );
        // A schema that refers to itself ends, at depth or nesting bound.
        let recursive = json!({"type": "object", "properties": {"next": {"$ref": "#"}}});
        assert_eq!(signature("s.list", &recursive, None), "s.list({next?: {next?: {next?: {...}}}})");
        let loop_ref = json!({"type": "object", "properties": {"x": {"$ref": "#/properties/x"}}});
        assert_eq!(signature("s.x", &loop_ref, None), "s.x({x?: any})");
    }

    #[test]
    fn code_18_describe_tool_gives_the_schema_its_signature_cuts_short() {
        let mut properties = Map::new();
        for i in 0..40 {
            properties.insert(format!("property_{i}"), json!({"type": "string"}));
        }
        let referenced = json!({
            "type": "object",
            "properties": {"mode": {"$ref": "#/$defs/mode"}},
            "$defs": {"mode": {"description": "How to rank.", "enum": ["a", "b"]}}
        });
        let tools = [
            tool(Some("big"), "wide", "Many parameters.", json!({"type": "object", "properties": properties}), None),
            tool(Some("big"), "referenced", "A parameter by reference.", referenced, None),
        ];
        let catalog = Catalog::new(&tools);
        // 40 parameters do not fit the signature: the schema comes along unasked.
        let wide = catalog.describe_tool("big.wide", false).unwrap();
        assert!(wide["signature"].as_str().unwrap().contains('…'), "{wide}");
        assert_eq!(wide["input_schema"]["properties"].as_object().unwrap().len(), 40, "{wide}");
        // A description on the definition a `$ref` points to is the parameter's.
        let referenced = catalog.describe_tool("big.referenced", false).unwrap();
        assert_eq!(referenced["parameters"], json!({"mode": "How to rank."}), "{referenced}");
        assert!(referenced.get("input_schema").is_none(), "{referenced}");
    }

    #[test]
    fn code_18_huge_schema_gives_a_bounded_signature() {
        let mut properties = Map::new();
        for i in 0..3000 {
            let values: Vec<String> = (0..200).map(|v| format!("value_{i}_{v}")).collect();
            properties.insert(format!("property_{i}"), json!({"enum": values}));
        }
        let schema = json!({"type": "object", "properties": properties, "required": ["property_0"]});
        let mut output = Map::new();
        for i in 0..3000 {
            output.insert(format!("field_{i}"), json!({"type": "string"}));
        }
        let out = json!({"type": "object", "properties": output});
        let text = signature("big.tool", &schema, Some(&out));
        assert!(text.chars().count() <= "big.tool()".len() + " -> ".len() + INPUT_CHARS + OUTPUT_CHARS + 2, "{text}");
        assert!(text.starts_with(r#"big.tool({property_0: "value_0_0"|"value_0_1"|"#), "{text}");
        assert!(text.contains("…) -> {"), "{text}");
        // The result shows its first 16 fields, then says there are more.
        assert!(text.ends_with("field_15?: string, …}"), "{text}");
        let example = example("big.tool", &schema);
        assert_eq!(example, r#"local r = big.tool({property_0 = "value_0_0"}):await()"#);
    }

    #[test]
    fn code_18_example_uses_placeholders_for_required_parameters() {
        let schema = json!({
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "n": {"type": "integer"},
                "ratio": {"type": "number"},
                "on": {"type": "boolean"},
                "sort": {"enum": ["stars", "forks"]},
                "ids": {"type": "array"},
                "filter": {"type": "object"},
                "x-y": {"type": "string"},
                "optional": {"type": "string"}
            },
            "required": ["query", "n", "ratio", "on", "sort", "ids", "filter", "x-y"]
        });
        assert_eq!(
            example("github.search_repos", &schema),
            r#"local r = github.search_repos({query = "...", n = 1, ratio = 1, on = true, sort = "stars", ids = {}, filter = {}, ["x-y"] = "..."}):await()"#
        );
        assert_eq!(example("ctx.sources", &json!({"type": "object"})), "local r = ctx.sources({}):await()");
    }

    #[test]
    fn code_18_summary_is_the_first_sentence_bounded() {
        assert_eq!(summary("Search GitHub repositories. Returns matches.", 120), "Search GitHub repositories.");
        assert_eq!(summary("\n  First line\nsecond line", 120), "First line");
        assert_eq!(summary("Version 1.2 is here", 120), "Version 1.2 is here");
        let long = "word ".repeat(100);
        let cut = summary(&long, 120);
        assert!(cut.chars().count() <= 120 && cut.ends_with('…'), "{cut}");
        assert_eq!(summary("", 120), "");
        assert_eq!(summary("Reads a file, e.g. a config. Then more.", 120), "Reads a file, e.g. a config.");
        assert_eq!(summary("Done! really", 120), "Done! really");
    }

    #[test]
    fn code_18_names_are_split_into_words_for_search() {
        assert_eq!(words("search_repos"), "search repos");
        assert_eq!(words("searchRepos"), "search Repos searchRepos");
        assert_eq!(words("HTTPServer.get-v2"), "HTTP Server get v2 HTTPServer.get-v2");
        assert_eq!(words("list-items"), "list items");
    }

    #[test]
    fn code_18_describe_tool_reaches_names_that_are_not_installed() {
        let catalog = Catalog::new(&[
            simple(Some("github"), "list-items", "List items."),
            simple(Some("github"), "list.items", "List other items."),
            simple(Some("my.api"), "x", "X."),
            simple(Some("my-api"), "x", "Another X."),
        ]);
        let described = catalog.describe_tool(r#"mcp.github["list-items"]"#, false).unwrap();
        assert_eq!(described["name"], "github__list-items");
        assert!(described["note"].as_str().unwrap().contains("several tools"), "{described}");
        assert_eq!(catalog.describe_tool("github.list.items", false).unwrap()["name"], "github__list.items");
        assert_eq!(catalog.describe_tool("my.api.x", false).unwrap()["name"], "my.api__x");
        assert_eq!(catalog.describe_tool(r#"mcp['my-api'].x"#, false).unwrap()["name"], "my-api__x");
        // `my_api` names neither server, and `x` names two tools.
        assert!(catalog.describe_tool("my_api.x", false).is_err());
        assert!(catalog.describe_tool("x", false).is_err());
        assert!(catalog.describe_tool("github.list_items", false).is_err());
    }

    #[test]
    fn code_18_list_servers_and_tools() {
        let catalog = catalog();
        assert_eq!(catalog.len(), 12);
        let servers = catalog.list_servers();
        let names: Vec<&str> =
            servers["servers"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["ctx", "confluence", "github", "jira", "slack", "string"]);
        assert_eq!(servers["servers"][0], json!({"name": "ctx", "global": "ctx", "tools": 3}));
        let string = &servers["servers"][5];
        assert_eq!(string["global"], Json::Null);
        assert!(string["note"].as_str().unwrap().contains(r#"mcp["string"]"#));

        let github = catalog.list_tools("github").unwrap();
        assert_eq!(github["server"], "github");
        assert_eq!(
            github["tools"][0],
            json!({"name": "github__search_repos", "call": "github.search_repos", "summary": "Search GitHub repositories."})
        );
        assert_eq!(github["tools"][2]["call"], "github.listPullRequests");
        let string = catalog.list_tools("string").unwrap();
        assert_eq!(string["tools"][0]["call"], r#"mcp["string"]["tool-name"]"#);
        assert!(string["note"].is_string());
        let err = catalog.list_tools("gitlab").unwrap_err();
        assert!(err.contains("`gitlab`") && err.contains("`github`") && err.contains("list_servers()"), "{err}");
    }

    #[test]
    fn code_18_describe_tool_by_any_name() {
        let catalog = catalog();
        let described = catalog.describe_tool("github__search_repos", false).unwrap();
        assert_eq!(described["name"], "github__search_repos");
        assert_eq!(described["call"], "github.search_repos");
        assert_eq!(
            described["signature"],
            r#"github.search_repos({query: string, per_page?: integer = 30, sort?: "stars"|"forks"}) -> {total_count: integer, items: {name?: string}[]}"#
        );
        assert_eq!(described["example"], r#"local r = github.search_repos({query = "..."}):await()"#);
        // Only described parameters are listed: the signature has the rest.
        assert_eq!(described["parameters"], json!({"query": "GitHub search syntax."}));
        assert!(described.get("note").is_none() && described.get("input_schema").is_none(), "{described}");
        // The raw schemas on request only.
        let full = catalog.describe_tool("github__search_repos", true).unwrap();
        assert_eq!(full["input_schema"]["required"], json!(["query"]));
        assert_eq!(full["output_schema"]["required"], json!(["total_count", "items"]));
        for key in
            ["github.search_repos", "search_repos", "mcp.github.search_repos", r#"mcp["github"]["search_repos"]"#]
        {
            assert_eq!(catalog.describe_tool(key, false).unwrap()["name"], "github__search_repos", "{key}");
        }
        let shadowed = catalog.describe_tool(r#"mcp["string"]["tool-name"]"#, false).unwrap();
        assert_eq!(shadowed["name"], "string__tool-name");
        assert!(shadowed["note"].as_str().unwrap().contains("shadow"));
        let shadowed = catalog.describe_tool(r#"mcp["string"]["tool-name"]"#, true).unwrap();
        assert!(shadowed["input_schema"].is_object() && shadowed.get("output_schema").is_none(), "{shadowed}");
        assert_eq!(catalog.describe_tool("ctx.search", false).unwrap()["name"], "search");

        // Two servers have `create_issue`: the bare name is ambiguous, and the error says which.
        let err = catalog.describe_tool("create_issue", false).unwrap_err();
        assert!(err.contains("`github__create_issue`") && err.contains("`jira__create_issue`"), "{err}");
        let err = catalog.describe_tool("github__serch_repos", false).unwrap_err();
        assert!(err.contains("Close names: `github__search_repos`"), "{err}");
        assert!(err.contains("search_tools(query)"), "{err}");
        for hostile in ["", "   ", "[[", r#"mcp["#, r#"a["b"#, "x".repeat(100_000).as_str(), "🦀.🦀", "...."] {
            assert!(catalog.describe_tool(hostile, false).is_err(), "{hostile}");
        }
    }

    #[test]
    fn code_18_search_ranks_jira_create_issue_first_for_a_question() {
        let catalog = catalog();
        let found = catalog.search_tools("create a jira ticket", 5).unwrap();
        let names: Vec<&str> = found["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names.first(), Some(&"jira__create_issue"), "{found}");
        assert!(names.contains(&"github__create_issue"), "any word matches: {found}");
        let scores: Vec<f64> =
            found["tools"].as_array().unwrap().iter().map(|t| t["score"].as_f64().unwrap()).collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
        assert_eq!(found["tools"][0]["call"], "jira.create_issue");
        assert_eq!(found["tools"][0]["summary"], "Create a Jira issue (a ticket) in a project.");

        // The name outranks the description: "repositories" is in two descriptions, "repos" only
        // in one name, split from camelCase or snake_case.
        let repos = catalog.search_tools("repos", 10).unwrap();
        assert_eq!(repos["tools"][0]["name"], "github__search_repos", "{repos}");
        let pulls = catalog.search_tools("pull requests", 10).unwrap();
        assert_eq!(pulls["tools"][0]["name"], "github__listPullRequests", "{pulls}");
        let exact = catalog.search_tools("listPullRequests", 10).unwrap();
        assert_eq!(exact["tools"][0]["name"], "github__listPullRequests", "{exact}");
        let slack = catalog.search_tools("post to slack", 10).unwrap();
        assert_eq!(slack["tools"][0]["name"], "slack__post_message", "{slack}");
        // Words match in any English form: the index stems them as the knowledge base's
        // `stemming = "english"` does.
        let forms = catalog.search_tools("creating jira issues", 5).unwrap();
        assert_eq!(forms["tools"][0]["name"], "jira__create_issue", "{forms}");
        let posted = catalog.search_tools("posting messages", 5).unwrap();
        assert_eq!(posted["tools"][0]["name"], "slack__post_message", "{posted}");
    }

    #[test]
    fn code_18_search_survives_hostile_queries() {
        let catalog = catalog();
        let long = "jira ".repeat(10_000);
        for query in [
            "\"",
            "\"unbalanced",
            "*",
            "jira*",
            "NEAR(create issue)",
            "-jira",
            "name:jira",
            "jira AND OR NOT",
            "^create",
            "🦀 create 🦀",
            "'; DROP TABLE tools; --",
            "\0",
            "{}[]()",
            long.as_str(),
        ] {
            let found = catalog.search_tools(query, 10).unwrap_or_else(|e| panic!("{query}: {e}"));
            assert!(found["tools"].is_array(), "{query}");
        }
        for query in ["", "   ", "\"\"", "***", "🦀", "-:^()"] {
            let found = catalog.search_tools(query, 10).unwrap();
            assert_eq!(found["tools"], json!([]), "{query}");
            assert!(found["message"].as_str().unwrap().contains("no words"), "{query}");
        }
        let none = catalog.search_tools("kubernetes", 10).unwrap();
        assert_eq!(none["tools"], json!([]));
        assert!(none["message"].is_string());
        assert_eq!(catalog.search_tools(&long, 10).unwrap()["query"].as_str().unwrap().chars().count(), ECHO_CHARS);
    }

    #[test]
    fn code_18_search_limit_is_clamped() {
        let tools: Vec<ToolSpec> =
            (0..80).map(|i| simple(Some("bulk"), &format!("widget_{i}"), "Make a widget.")).collect();
        let catalog = Catalog::new(&tools);
        let count = |limit| catalog.search_tools("widget", limit).unwrap()["tools"].as_array().unwrap().len();
        assert_eq!(count(0), 1);
        assert_eq!(count(7), 7);
        assert_eq!(count(1000), SEARCH_LIMIT);
    }

    #[test]
    fn code_18_prompt_lists_signatures_and_how_to_call() {
        let catalog = catalog();
        let prompt = catalog.prompt("execute");
        assert!(prompt.starts_with("# execute\n"), "{prompt}");
        for needle in [
            "local r = github.search_repos({query = \"...\"}):await()",
            "`result(value)`",
            "`return value`",
            "`await_all({a, b})`",
            "pcall",
            "`err.tool`",
            "## github (3 tools)",
            r#"- `github.search_repos({query: string, per_page?: integer = 30, sort?: "stars"|"forks"}) -> {total_count: integer, items: {name?: string}[]}`"#,
            "  Search GitHub repositories.\n",
            "## string (1 tool)",
            r#"mcp["string"]["tool-name"]({})"#,
            "## Tips",
            "`describe_tool(name)`",
            "`search_tools(query)`",
        ] {
            assert!(prompt.contains(needle), "missing {needle:?} in:\n{prompt}");
        }
        assert!(prompt.find("## ctx").unwrap() < prompt.find("## confluence").unwrap());
        assert_eq!(prompt, Catalog::new(&fixture()).prompt("execute"), "deterministic");
    }

    #[test]
    fn code_18_prompt_turns_compact_beyond_fifty_tools() {
        let mut tools = vec![search_repos()];
        let blurb = "Do something useful with widgets, described at some length so the line needs cutting.";
        tools.extend((0..COMPACT_AFTER).map(|i| simple(Some("bulk"), &format!("tool_{i}"), blurb)));
        let catalog = Catalog::new(&tools);
        assert_eq!(catalog.len(), COMPACT_AFTER + 1);
        let prompt = catalog.prompt("ops");
        assert!(
            prompt.contains("- `bulk.tool_7`: Do something useful with widgets, described at some length…\n"),
            "{prompt}"
        );
        assert!(prompt.contains("- `github.search_repos`: Search GitHub repositories.\n"), "{prompt}");
        assert!(!prompt.contains("query: string"), "no signatures in the compact form");
        assert!(prompt.contains("`describe_tool(name)` gives a tool's signature"), "{prompt}");
        assert!(prompt.contains("`search_tools(query)`"));

        // At the threshold the full form remains.
        let full = Catalog::new(&tools[..COMPACT_AFTER]).prompt("ops");
        assert!(full.contains("- `bulk.tool_7({})`\n"), "{full}");
        assert!(full.contains("query: string"));
    }

    /// The worst a script can hand discovery (names are cut at 1024 bytes before they get
    /// here): 3000 tools in 150 servers, and keys made of dots (every split is tried), of one
    /// letter (every tool is compared), and FTS5 syntax. Each answers, none errors into a
    /// panic; the time each took is printed for the audit in `lua/bounds.rs`.
    #[test]
    fn code_18_discovery_answers_worst_case_keys_over_3000_tools() {
        let tools: Vec<ToolSpec> = (0..3000)
            .map(|i| simple(Some(&format!("server.{:03}", i / 20)), &format!("tool_{i}"), "Does a thing."))
            .collect();
        let catalog = Catalog::new(&tools);
        let dots = ".a".repeat(512);
        let letters = "a".repeat(1024);
        let near = "tool_".repeat(204);
        let fts = "\"NEAR( * - : ^ ".repeat(64);
        for key in [dots.as_str(), letters.as_str(), near.as_str(), fts.as_str()] {
            let started = std::time::Instant::now();
            assert!(catalog.describe_tool(key, false).is_err());
            let described = started.elapsed();
            let started = std::time::Instant::now();
            assert!(catalog.search_tools(key, 50).is_ok());
            let searched = started.elapsed();
            let started = std::time::Instant::now();
            assert!(catalog.list_tools(key).is_err());
            println!("{} bytes: describe {described:?}, search {searched:?}, list {:?}", key.len(), started.elapsed());
        }
    }

    /// The most `describe_tool` hands back: a tool whose entry is as large as an upstream entry
    /// may be (256 KiB, `upstream::catalog::MAX_ENTRY_BYTES`), with long descriptions on 1,300
    /// parameters. The answer stays within about twice the entry, with or without the schemas
    /// (the signature cuts the parameters short, so the input schema comes along unasked); the
    /// time each took is printed for the audit in `lua/bounds.rs`.
    #[test]
    fn code_18_describe_tool_answer_is_bounded_by_its_entry() {
        let mut properties = Map::new();
        for i in 0..1300 {
            properties.insert(format!("p{i}"), json!({"type": "string", "description": "d".repeat(150)}));
        }
        let input = json!({"type": "object", "properties": properties});
        let entry = serde_json::to_vec(&input).unwrap().len();
        assert!(entry <= crate::upstream::catalog::MAX_ENTRY_BYTES, "{entry} bytes");
        let catalog = Catalog::new(&[tool(Some("big"), "t", "Big.", input, None)]);
        for schemas in [false, true] {
            let started = std::time::Instant::now();
            let answer = catalog.describe_tool("big.t", schemas).unwrap();
            let took = started.elapsed();
            let bytes = serde_json::to_vec(&answer).unwrap().len();
            assert!(bytes <= 2 * entry + 4096, "schemas {schemas}: {bytes} bytes for a {entry}-byte entry");
            assert_eq!(answer["parameters"].as_object().unwrap().len(), 1300);
            println!("schemas {schemas}: {bytes} bytes for a {entry}-byte entry in {took:?}");
        }
    }

    #[test]
    fn code_18_execute_description_stays_short_with_3000_tools() {
        let tools: Vec<ToolSpec> = (0..3000)
            .map(|i| {
                simple(
                    Some(&format!("server-with-a-long-name-{:03}", i / 20)),
                    &format!("tool_{i}"),
                    &"A long description. ".repeat(50),
                )
            })
            .collect();
        let catalog = Catalog::new(&tools);
        let text = catalog.execute_description();
        assert!(text.chars().count() < 4000, "{} chars:\n{text}", text.chars().count());
        for needle in ["list_servers", "list_tools", "describe_tool", "search_tools", "await_all", "result(value)"] {
            assert!(text.contains(needle), "missing {needle}:\n{text}");
        }
        assert!(text.contains("Servers (3000 tools): server-with-a-long-name-000 (20), "), "{text}");
        assert!(text.ends_with(", and 130 more servers."), "{text}");
        assert!(text.contains("upstream ones: `server.tool({...}):await()`"), "{text}");

        // Without upstream servers it says nothing of them.
        let small = Catalog::new(&[simple(None, "search", "Search.")]).execute_description();
        assert!(small.ends_with("Servers (1 tool): ctx (1)."), "{small}");
        assert!(!small.contains("upstream"), "{small}");
        assert!(Catalog::new(&[]).execute_description().ends_with("Servers (0 tools): none."));
    }
}
