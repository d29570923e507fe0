//! `[code_mode]` and `[tools.scripted.<name>]`: the limits and permissions of agent-sent Lua
//! scripts (the `execute` tool) and of the scripted tools an operator composes from globs.
//!
//! The shapes below are the contract between the config layer and `crate::code`. The schema
//! (`CodeModeConfig`, `ScriptedToolConfig`) checks types and bounds; this module adds what it
//! cannot say (globs that compile, names free of the built-ins, an existing `fs_root`) and turns
//! the typed sections into [`CodeMode`] and [`ScriptedSection`]s.

use std::path::{Path, PathBuf};
use std::time::Duration;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde_json::Value;

use super::{toml_source, ConfigProblem, ReservedVar};
use crate::types;

/// The built-in tools code mode adds. A scripted tool cannot take one of these names, nor one
/// of [`crate::contract::BUILTINS`], whether or not code mode is enabled: the names stay reserved
/// so turning it on never renames an operator's tool.
pub const CODE_MODE_TOOLS: [&str; 5] = ["execute", "list_servers", "list_tools", "describe_tool", "search_tools"];

/// Whether `name` is a built-in tool's, which a scripted tool cannot shadow.
pub fn is_builtin(name: &str) -> bool {
    crate::contract::BUILTINS.contains(&name) || CODE_MODE_TOOLS.contains(&name)
}

/// The globs compiled into one set, for matching registry tool names. The config refused a
/// glob that does not compile, so none is skipped for a loaded config.
pub fn glob_set(globs: &[String]) -> GlobSet {
    let mut builder = GlobSetBuilder::new();
    for glob in globs.iter().filter_map(|g| Glob::new(g).ok()) {
        builder.add(glob);
    }
    builder.build().unwrap_or_else(|_| GlobSet::empty())
}

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
    /// (default 16). More wait their turn; time spent waiting does not count against a call's
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
            max_concurrent: 16,
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
    /// Absolute folder `fs.*` may read (canonical: symbolic links resolved).
    pub fs_root: Option<PathBuf>,
    /// Variables ctx uses for a secret elsewhere in the config: `env.get` never reads them,
    /// whatever `allow_env` says (as for a script section).
    pub reserved_env: Vec<ReservedVar>,
}

impl CodeMode {
    /// `destructive`, compiled.
    pub fn destructive_set(&self) -> GlobSet {
        glob_set(&self.destructive)
    }

    /// `allow_destructive`, compiled.
    pub fn allow_destructive_set(&self) -> GlobSet {
        glob_set(&self.allow_destructive)
    }
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
            reserved_env: Vec::new(),
        }
    }
}

/// `[tools.scripted.<name>]`, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct ScriptedSection {
    /// The section key: the tool's name.
    pub name: String,
    pub description: String,
    /// The display title MCP clients show, if the section sets one.
    pub title: Option<String>,
    /// Globs over registry tool names: the only tools that exist inside the script.
    pub tools: Vec<String>,
    /// `[code_mode]`'s limits with the section's own overrides applied.
    pub limits: CodeLimits,
}

impl ScriptedSection {
    /// `tools`, compiled: the registry names that exist inside the section's scripts.
    pub fn tool_set(&self) -> GlobSet {
        glob_set(&self.tools)
    }
}

/// The section's limits as written (`[code_mode]`) or its overrides (`[tools.scripted.*]`,
/// `None` where it inherits).
struct Written {
    timeout: Option<u64>,
    memory_mb: Option<u64>,
    max_instructions: Option<i64>,
    max_calls: Option<u64>,
    max_concurrent: Option<u64>,
    max_output_bytes: Option<i64>,
    max_log_lines: Option<i64>,
}

impl CodeLimits {
    /// These limits with what `written` sets instead. The schema bounds every value, so the
    /// conversions only saturate on a platform too small for them.
    fn with(&self, written: &Written) -> CodeLimits {
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        let unsigned = |v: i64| u64::try_from(v).unwrap_or(0);
        CodeLimits {
            timeout: written.timeout.map(Duration::from_secs).unwrap_or(self.timeout),
            memory_bytes: written.memory_mb.map(|mb| size(mb).saturating_mul(1024 * 1024)).unwrap_or(self.memory_bytes),
            max_instructions: written.max_instructions.map(unsigned).unwrap_or(self.max_instructions),
            max_calls: written.max_calls.map(size).unwrap_or(self.max_calls),
            max_concurrent: written.max_concurrent.map(size).unwrap_or(self.max_concurrent),
            max_output_bytes: written.max_output_bytes.map(|b| size(unsigned(b))).unwrap_or(self.max_output_bytes),
            max_log_lines: written
                .max_log_lines
                .map(|n| u32::try_from(unsigned(n)).unwrap_or(u32::MAX))
                .unwrap_or(self.max_log_lines),
        }
    }
}

/// What the schema cannot say about `[code_mode]` and `[tools.scripted.*]`: globs that compile
/// and scripted tool names that are not a built-in's. `unresolved` tells the keys that still
/// hold an unset `${VAR}`: their value says nothing yet.
pub(super) fn section_problems(
    value: &Value,
    text: &str,
    unresolved: &dyn Fn(&str) -> bool,
) -> Vec<(Vec<String>, ConfigProblem)> {
    let mut problems = Vec::new();
    let mut push = |path: Vec<String>, message: String| {
        // Spelled as the schema's own problems spell keys (`tools.scripted."odd name"`).
        let key = crate::schema::Problem { path: path.clone(), message: String::new() }.dotted();
        problems.push((path.clone(), ConfigProblem { key, line: toml_source::line_of(text, &path), message }));
    };
    let mut globs = |prefix: &[&str], list: &str, node: &Value| {
        let items = node.get(list).and_then(Value::as_array);
        for (i, glob) in items.into_iter().flatten().enumerate() {
            let mut path: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
            path.extend([list.to_string(), i.to_string()]);
            if let Some(Err(message)) =
                glob.as_str().filter(|_| !unresolved(&path.join("."))).map(super::upstream::check_glob)
            {
                push(path, message);
            }
        }
    };
    if let Some(code_mode) = value.get("code_mode") {
        for list in ["destructive", "allow_destructive"] {
            globs(&["code_mode"], list, code_mode);
        }
    }
    let scripted = value.pointer("/tools/scripted").and_then(Value::as_object);
    for (name, section) in scripted.into_iter().flatten() {
        globs(&["tools", "scripted", name], "tools", section);
    }
    for name in scripted.into_iter().flat_map(|s| s.keys()).filter(|n| is_builtin(n)) {
        push(
            vec!["tools".into(), "scripted".into(), name.clone()],
            format!("'{name}' is a built-in tool's name; built-ins cannot be shadowed, so rename the section"),
        );
    }
    problems
}

/// `[code_mode]` and the `[tools.scripted.*]` sections (by name) of a validated config, and the
/// problems found resolving them. `refs` are the config's expanded variables, which `env.get`
/// must never read.
pub(super) fn from_spec(
    spec: &types::Config,
    base_dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    text: &str,
    refs: &[super::expand::VarRef],
) -> (CodeMode, Vec<ScriptedSection>, Vec<ConfigProblem>) {
    let mut problems = Vec::new();
    let section = &spec.code_mode;
    let limits = CodeLimits::default().with(&Written {
        timeout: Some(section.timeout),
        memory_mb: Some(section.memory_mb),
        max_instructions: Some(section.max_instructions),
        max_calls: Some(section.max_calls),
        max_concurrent: Some(section.max_concurrent),
        max_output_bytes: Some(section.max_output_bytes),
        max_log_lines: Some(section.max_log_lines),
    });
    let fs_root = match section.fs_root.as_deref().map(|root| folder(root, base_dir, env)).transpose() {
        Ok(root) => root,
        Err(message) => {
            let path = ["code_mode", "fs_root"].map(String::from);
            let line = toml_source::line_of(text, &path);
            problems.push(ConfigProblem { key: path.join("."), line, message: super::redact::string(message) });
            None
        }
    };
    let code_mode = CodeMode {
        enabled: section.enabled,
        limits: limits.clone(),
        destructive: section.destructive.iter().map(|g| g.to_string()).collect(),
        allow_destructive: section.allow_destructive.iter().map(|g| g.to_string()).collect(),
        allow_hosts: super::non_empty(section.allow_hosts.iter().map(|s| s.to_string())),
        allow_private: section.allow_private,
        allow_env: super::non_empty(section.allow_env.iter().map(|s| s.to_string())),
        fs_root,
        reserved_env: super::reserved_for("code_mode.", refs),
    };
    let scripted = spec
        .tools
        .scripted
        .iter()
        .map(|(name, s)| ScriptedSection {
            name: name.to_string(),
            description: s.description.to_string(),
            title: s.title.as_ref().map(|t| t.to_string()),
            tools: s.tools.iter().map(|g| g.to_string()).collect(),
            limits: limits.with(&Written {
                timeout: s.timeout,
                memory_mb: s.memory_mb,
                max_instructions: s.max_instructions,
                max_calls: s.max_calls,
                max_concurrent: s.max_concurrent,
                max_output_bytes: s.max_output_bytes,
                max_log_lines: s.max_log_lines,
            }),
        })
        .collect();
    (code_mode, scripted, problems)
}

/// `fs_root` resolved (relative to the config file's folder, `~/` the home folder) to the
/// canonical path of an existing folder: `fs.*` compares canonical paths against it.
fn folder(written: &str, base_dir: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<PathBuf, String> {
    let path = super::upstream::resolve_path(written, base_dir, env)?;
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => std::fs::canonicalize(&path)
            .map_err(|e| format!("cannot resolve folder {written:?}: {e}")),
        Ok(_) => Err(format!("{written:?} is not a folder; point fs_root at the folder scripts may read")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "folder {written:?} does not exist (relative paths are relative to the config file's folder); create it or fix fs_root"
        )),
        Err(e) => Err(format!("cannot read folder {written:?}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, ConfigError};

    fn load(text: &str) -> Result<Config, ConfigError> {
        let env = |name: &str| (name == "CM_TOKEN").then(|| "cm-token-value-0123456789".to_string());
        Config::from_text(text, Path::new("ctx.toml"), Path::new("/w/ctx.toml"), &env)
    }

    #[test]
    fn config_18_overrides_replace_only_what_they_set() {
        let base = CodeLimits { timeout: Duration::from_secs(9), max_calls: 7, ..CodeLimits::default() };
        let written = Written {
            timeout: None,
            memory_mb: Some(2),
            max_instructions: None,
            max_calls: None,
            max_concurrent: Some(3),
            max_output_bytes: None,
            max_log_lines: Some(0),
        };
        let got = base.with(&written);
        assert_eq!(
            got,
            CodeLimits { memory_bytes: 2 * 1024 * 1024, max_concurrent: 3, max_log_lines: 0, ..base.clone() }
        );
    }

    #[test]
    fn config_18_builtin_names_and_glob_sets() {
        for name in
            ["search", "get", "sources", "execute", "list_servers", "list_tools", "describe_tool", "search_tools"]
        {
            assert!(is_builtin(name), "{name}");
        }
        assert!(!is_builtin("jira_flow") && !is_builtin("Execute"));
        let set = glob_set(&["jira__*".to_string(), "search".into(), "a[".into()]);
        assert!(set.is_match("jira__create_issue") && set.is_match("search"));
        assert!(!set.is_match("github__search") && !set.is_match("searches"));
        assert!(glob_set(&[]).is_empty());
    }

    #[test]
    fn config_18_env_get_never_reads_a_variable_used_elsewhere() {
        let text = "[server]\nauth_token = \"${CM_TOKEN}\"\n\n[code_mode]\nallow_env = [\"CM_TOKEN\", \"LANG\"]\n";
        let config = load(text).unwrap();
        assert_eq!(config.code_mode.allow_env.as_deref(), Some(&["CM_TOKEN".to_string(), "LANG".into()][..]));
        let reserved: Vec<(&str, &str)> =
            config.code_mode.reserved_env.iter().map(|r| (r.var.as_str(), r.key.as_str())).collect();
        assert_eq!(reserved, [("CM_TOKEN", "server.auth_token")]);
    }

    #[test]
    fn config_18_scripted_keys_are_spelled_like_the_schema_spells_them() {
        let err = load("[tools.scripted.\"a b\"]\ndescription = \"d\"\ntools = [\"x{\"]\n").unwrap_err().to_string();
        assert!(err.contains("tools.scripted.\"a b\" (line 1): invalid name"), "{err}");
        assert!(err.contains("tools.scripted.\"a b\".tools.0 (line 3): not a valid glob pattern"), "{err}");
    }
}
