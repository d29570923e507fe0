//! `ctx.toml`: located, parsed, `${VAR}`-expanded, validated against `config.schema.json`, typed.
//!
//! Raw TOML becomes a [`Config`] once, here; the rest of ctx only sees validated, typed values
//! with absolute paths.

mod broken;
pub mod code_mode;
mod error;
mod expand;
pub mod hosts;
mod mcp_import;
pub mod rate;
mod toml_source;
pub mod upstream;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Map, Value};

pub use broken::{BrokenSection, SectionKind};
pub use error::{ConfigError, ConfigProblem};
// Secrets and their redaction sit in the contract, below every module that shows a message.
pub use crate::contract::redact;
pub use expand::expand as expand_vars;

use crate::schema::{Dialect, SchemaValidator};
use crate::types;

/// Environment variable that names the config file when `--config` is not given.
pub const CONFIG_ENV: &str = "CTX_CONFIG";
/// The config file looked for in the current folder when neither `--config` nor `CTX_CONFIG` is set.
pub const DEFAULT_FILE: &str = "ctx.toml";

/// Where the config file path came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    pub path: PathBuf,
    pub how: &'static str,
}

/// Lookup order: `--config`, then `$CTX_CONFIG`, then `./ctx.toml`.
pub fn locate(flag: Option<&Path>) -> Located {
    if let Some(path) = flag {
        return Located { path: path.to_path_buf(), how: "from --config" };
    }
    match std::env::var_os(CONFIG_ENV) {
        Some(value) if !value.is_empty() => Located { path: PathBuf::from(value), how: "from $CTX_CONFIG" },
        _ => Located { path: PathBuf::from(DEFAULT_FILE), how: "the default ./ctx.toml" },
    }
}

/// Which kind of extension a script section configures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ScriptKind {
    Connector,
    Tool,
    Agent,
    /// An agent-sent script (`execute`) or a scripted tool's: no file, no config section of
    /// its own (`[code_mode]` sets its limits and permissions).
    Code,
}

impl ScriptKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ScriptKind::Connector => "connector",
            ScriptKind::Tool => "tool",
            ScriptKind::Agent => "agent",
            ScriptKind::Code => "script",
        }
    }

    /// The deadline a script of this kind gets when its section sets no `timeout`.
    pub fn default_timeout(self) -> Duration {
        match self {
            ScriptKind::Connector => Duration::from_secs(300),
            ScriptKind::Tool | ScriptKind::Agent | ScriptKind::Code => Duration::from_secs(30),
        }
    }

    /// The config table that holds sections of this kind, e.g. `tools.script`.
    pub fn section(self) -> &'static str {
        match self {
            ScriptKind::Connector => "connectors.script",
            ScriptKind::Tool => "tools.script",
            ScriptKind::Agent => "agents.script",
            ScriptKind::Code => "code_mode",
        }
    }
}

/// A `[connectors|tools|agents.script.<name>]` section, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct ScriptSection {
    pub kind: ScriptKind,
    pub name: String,
    /// Absolute path of the script.
    pub path: PathBuf,
    /// The path as written in the config, for messages that must not show absolute paths.
    pub display_path: String,
    pub timeout: Duration,
    pub memory_limit_bytes: usize,
    pub max_result_bytes: usize,
    pub allow_hosts: Option<Vec<String>>,
    pub allow_env: Option<Vec<String>>,
    /// `http.*` may reach private, loopback and link-local addresses.
    pub allow_private: bool,
    /// Tools only: calls may run long (`long_running = true`), see `ToolSpec::long_running`.
    pub long_running: bool,
    /// Variables ctx itself uses for a secret elsewhere in the config: `env.get` never reads
    /// them, whatever `allow_env` says.
    pub reserved_env: Vec<ReservedVar>,
    /// The free keys of the section, `${VAR}` expanded: the script's `config` table.
    pub config: Map<String, Value>,
}

/// An environment variable another part of the config uses, and the first key that uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservedVar {
    pub var: String,
    pub key: String,
}

impl ScriptSection {
    /// A section for a script run straight from a path (`ctx tool test` without `--source`):
    /// named after the file, default limits, no config keys.
    pub fn from_path(kind: ScriptKind, path: &Path) -> Self {
        let limits = crate::contract::Limits::with_timeout(kind.default_timeout());
        ScriptSection {
            kind,
            name: path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
            path: std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
            display_path: path.display().to_string(),
            timeout: limits.timeout,
            memory_limit_bytes: limits.memory_bytes,
            max_result_bytes: limits.max_result_bytes,
            allow_hosts: None,
            allow_env: None,
            allow_private: false,
            long_running: false,
            reserved_env: Vec::new(),
            config: Map::new(),
        }
    }
}

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The config file, absolute.
    pub file: PathBuf,
    /// Its folder: every relative path in the config is relative to it.
    pub base_dir: PathBuf,
    /// The typed settings, generated from `config.schema.json`.
    pub spec: types::Config,
    /// Every usable script section, ordered by kind then name.
    pub scripts: Vec<ScriptSection>,
    /// Sections an unset `${VAR}` disables, ordered by table then name. They are in neither
    /// `spec` nor `scripts`; whoever lists tools, agents or sources reports them as broken.
    pub broken: Vec<BrokenSection>,
    /// The upstream MCP servers (`[mcp.servers.*]` and `mcp.import`), by name. A server that
    /// cannot be used is in `broken` instead (see [`Config::broken_upstreams`]).
    pub upstreams: Vec<upstream::UpstreamSection>,
    /// The file `mcp.import` names, absolute, when it is set: hot reload watches it too.
    pub mcp_import: Option<PathBuf>,
    /// What loaded but deserves a word (a server that ctx.toml and the imported file both
    /// define). [`Config::load`] logs them; `ctx schema check` prints them.
    pub warnings: Vec<String>,
    /// `[code_mode]`: the limits and permissions of agent-sent scripts.
    pub code_mode: code_mode::CodeMode,
    /// `[tools.scripted.*]`, by name.
    pub scripted: Vec<code_mode::ScriptedSection>,
}

/// What the config is loaded for: serving needs every secret of `[server]` and `[approval]`,
/// the commands that work on the files (search, log, approvals, run, ...) need none of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// `ctx serve` and `ctx schema check`: every problem counts.
    Serve,
    /// Every other command: a `${VAR}` that is not set in the server's tokens or the approver
    /// token leaves that token out instead of failing, since nothing here checks tokens.
    Local,
}

impl Config {
    /// Reads and validates the file at `located`, to serve it.
    pub fn load(located: &Located) -> Result<Config, ConfigError> {
        Config::load_for(located, Use::Serve)
    }

    /// Reads and validates the file at `located`, for `purpose`.
    pub fn load_for(located: &Located, purpose: Use) -> Result<Config, ConfigError> {
        let path = &located.path;
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ConfigError::NotFound { path: path.clone(), how: located.how })
            }
            Err(source) => return Err(ConfigError::Unreadable { path: path.clone(), source }),
        };
        let file = std::path::absolute(path).unwrap_or_else(|_| path.clone());
        let config = Self::from_text_for(&text, path, &file, &|name| std::env::var(name).ok(), purpose)?;
        for warning in &config.warnings {
            tracing::warn!("{warning}");
        }
        Ok(config)
    }

    /// Validates config text, to serve it. `shown` is the path used in messages; `file` the
    /// absolute one.
    pub fn from_text(
        text: &str,
        shown: &Path,
        file: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        Config::from_text_for(text, shown, file, env, Use::Serve)
    }

    /// Validates config text for `purpose`.
    pub fn from_text_for(
        text: &str,
        shown: &Path,
        file: &Path,
        env: &dyn Fn(&str) -> Option<String>,
        purpose: Use,
    ) -> Result<Config, ConfigError> {
        let mut value = toml_source::to_json(text).map_err(|e| ConfigError::Syntax {
            path: shown.to_path_buf(),
            line: e.line,
            column: e.column,
            message: e.message,
        })?;
        let mut expansion = expand::expand_all(&mut value, env);
        if purpose == Use::Local {
            drop_unset_tokens(&mut value, &mut expansion);
        }
        database_from_env(&mut value, env);
        let mut secrets = secrets_of(&expansion, &value);
        database_secret(&value, env, &mut secrets);
        redact::register(&secrets);
        let file_shown = shown.display().to_string();
        // Every problem with the path of its key: a problem inside a section that an unset
        // variable disables goes to that section, the rest make the config invalid.
        let mut found: Vec<(Vec<String>, ConfigProblem)> = expansion
            .missing
            .iter()
            .map(|m| {
                let problem = ConfigProblem {
                    line: toml_source::line_of(text, &m.path),
                    message: format!("environment variable {} is not set (referenced as ${{{}}})", m.var, m.var),
                    key: m.key.clone(),
                };
                (m.path.clone(), problem)
            })
            .collect();
        for problem in validator().problems(&value, Dialect::Toml) {
            // A value that still holds an unset `${VAR}` is reported once, as unset; what the
            // schema says of the placeholder text is noise.
            if expansion.missing.iter().any(|m| m.path == problem.path) {
                continue;
            }
            let line = toml_source::line_of(text, &problem.path);
            found.push((problem.path.clone(), ConfigProblem { key: problem.dotted(), line, message: problem.message }));
        }
        found.extend(host_rule_problems(&value, text));
        found.extend(database_problems(&value, text));
        for (path, message) in rate::config_problems(&value) {
            let problem = ConfigProblem { line: toml_source::line_of(text, &path), message, key: path.join(".") };
            found.push((path, problem));
        }
        let unresolved = |key: &str| expansion.missing.iter().any(|m| m.key == key);
        found.extend(upstream::section_problems(&value, text, &unresolved));
        found.extend(code_mode::section_problems(&value, text, &unresolved));
        // Taken before a broken server leaves `value`: ctx.toml's definition wins over an
        // imported one even when it is the broken one.
        let defined: BTreeSet<String> = value
            .pointer("/mcp/servers")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .collect();
        let disabled: BTreeSet<(usize, String)> =
            expansion.missing.iter().filter_map(|m| broken::section_of(&m.path)).collect();
        let mut problems = Vec::new();
        let mut set_aside: BTreeMap<(usize, String), Vec<ConfigProblem>> = BTreeMap::new();
        for (path, problem) in found {
            let problem = hide_secrets(problem, &expansion, &secrets);
            match broken::section_of(&path).filter(|s| disabled.contains(s)) {
                Some(section) => set_aside.entry(section).or_default().push(problem),
                None => problems.push(problem),
            }
        }
        let by_line = |p: &ConfigProblem| p.line.unwrap_or(usize::MAX);
        let invalid = |problems: Vec<ConfigProblem>| ConfigError::Invalid { path: shown.to_path_buf(), problems };
        if !problems.is_empty() {
            // The config fails as a whole: report the set-aside sections' problems with it.
            problems.extend(set_aside.into_values().flatten());
            problems.sort_by_key(by_line);
            return Err(invalid(problems));
        }
        let base_dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut broken_sections = Vec::new();
        for ((table, name), mut section_problems) in set_aside {
            let (first, second, kind) = broken::ISOLATED[table];
            // Out of the typed config: nothing can run it with `${VAR}` left in its values.
            let removed = value
                .get_mut(first)
                .and_then(|t| t.get_mut(second))
                .and_then(Value::as_object_mut)
                .and_then(|sections| sections.remove(&name));
            let path = removed.as_ref().and_then(|s| s.get("path")).and_then(Value::as_str).map(|p| base_dir.join(p));
            section_problems.sort_by_key(by_line);
            broken_sections.push(BrokenSection {
                refused: false,
                kind,
                table: format!("{first}.{second}"),
                name,
                path,
                file: file_shown.clone(),
                problems: section_problems,
            });
        }
        let spec: types::Config = serde_json::from_value(value.clone()).map_err(|e| {
            invalid(vec![ConfigProblem { key: "(top level)".into(), line: None, message: e.to_string() }])
        })?;
        if spec.chunking.overlap_tokens >= spec.chunking.max_tokens {
            problems.push(ConfigProblem {
                key: "chunking.overlap_tokens".into(),
                line: toml_source::line_of(text, &split("chunking.overlap_tokens")),
                message: format!(
                    "must be smaller than chunking.max_tokens ({}), got {}",
                    spec.chunking.max_tokens, spec.chunking.overlap_tokens
                ),
            });
        }
        let pass_env = upstream::global_pass_env(&value);
        let (mut upstreams, upstream_problems) =
            upstream::from_spec(&spec.mcp, &pass_env, &base_dir, &file_shown, env, text);
        problems.extend(upstream_problems);
        let mut warnings = Vec::new();
        let mut mcp_import = None;
        let mut refs = expansion.refs.clone();
        if let Some(written) = spec.mcp.import.as_deref() {
            let defaults = mcp_import::Defaults { pass_env: &pass_env, expose: upstream::expose(spec.mcp.expose) };
            mcp_import = upstream::resolve_path(written, &base_dir, env).ok();
            match mcp_import::read(written, &base_dir, env, &defaults, &defined, &file_shown) {
                Ok(imported) => {
                    redact::register(&imported.secrets);
                    upstreams.extend(imported.servers);
                    broken_sections.extend(imported.broken);
                    warnings.extend(imported.warnings);
                    refs.extend(imported.refs);
                }
                Err(message) => problems.push(ConfigProblem {
                    key: "mcp.import".into(),
                    line: toml_source::line_of(text, &split("mcp.import")),
                    message: redact::current().apply(&message).into_owned(),
                }),
            }
        }
        upstreams.sort_by(|a, b| a.name.cmp(&b.name));
        let (code_mode, scripted, code_mode_problems) = code_mode::from_spec(&spec, &base_dir, env, text, &refs);
        problems.extend(code_mode_problems);
        if !problems.is_empty() {
            return Err(invalid(problems));
        }
        let scripts = script_sections(&value, &spec, &base_dir, &refs);
        Ok(Config {
            file: file.to_path_buf(),
            base_dir,
            spec,
            scripts,
            broken: broken_sections,
            upstreams,
            mcp_import,
            warnings,
            code_mode,
            scripted,
        })
    }

    /// Resolves a path from the config against the config file's folder.
    pub fn resolve(&self, path: &str) -> PathBuf {
        let p = Path::new(path);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir.join(p)
        }
    }

    /// The SQLite database file.
    pub fn db_path(&self) -> PathBuf {
        self.resolve(&self.spec.db.path)
    }

    /// The usable script sections of one kind, by name.
    pub fn scripts_of(&self, kind: ScriptKind) -> impl Iterator<Item = &ScriptSection> {
        self.scripts.iter().filter(move |s| s.kind == kind)
    }

    /// The disabled sections of one kind (see [`BrokenSection`]).
    pub fn broken_of(&self, kind: ScriptKind) -> impl Iterator<Item = &BrokenSection> {
        self.broken.iter().filter(move |s| s.kind == SectionKind::Script(kind))
    }

    /// The upstream servers that cannot be used, from `ctx.toml` (`mcp.servers`) or the
    /// imported file (`mcpServers`): load problems of kind upstream.
    pub fn broken_upstreams(&self) -> impl Iterator<Item = &BrokenSection> {
        self.broken.iter().filter(|s| s.kind == SectionKind::Upstream)
    }
}

fn validator() -> &'static SchemaValidator {
    // Static: immutable, a validator of a schema compiled into the binary; every application may share it.
    static VALIDATOR: OnceLock<SchemaValidator> = OnceLock::new();
    VALIDATOR.get_or_init(|| SchemaValidator::for_definition("Config"))
}

fn split(key: &str) -> Vec<String> {
    key.split('.').map(str::to_owned).collect()
}

/// The keys a script section reserves; every other key goes to the script's `config` table.
pub fn reserved_script_keys() -> &'static [String] {
    // Static: immutable, derived from the schema files compiled into the binary; every application may share it.
    static KEYS: OnceLock<Vec<String>> = OnceLock::new();
    KEYS.get_or_init(|| {
        crate::schema::definitions("#/$defs/")["ScriptSectionConfig"]["properties"]
            .as_object()
            .map(|props| props.keys().cloned().collect())
            .unwrap_or_default()
    })
}

/// The secrets of a config (see [`redact`]): every expanded variable, then the literal values of
/// the secret settings and of script keys named like a secret.
/// For the commands that do not serve ([`Use::Local`]): a server token, scoped token or approver
/// token whose `${VAR}` is not set is left out (with its scoped-token entry), and is no problem.
/// Those commands read the files directly and check no token.
fn drop_unset_tokens(value: &mut Value, expansion: &mut expand::Expansion) {
    let is_token = |path: &[String]| match path {
        [server, key] if server == "server" && key == "auth_token" => true,
        [approval, key] if approval == "approval" && key == "approver_token" => true,
        [server, tokens, _, _] if server == "server" && tokens == "tokens" => true,
        _ => false,
    };
    let mut entries = BTreeSet::new();
    for missing in expansion.missing.iter().filter(|m| is_token(&m.path)) {
        tracing::debug!("{} is not set; {} is left out (this command checks no token)", missing.var, missing.key);
        match missing.path.as_slice() {
            [_, _, index, _] => {
                entries.extend(index.parse::<usize>().ok());
            }
            [table, key] => {
                value.get_mut(table.as_str()).and_then(Value::as_object_mut).map(|t| t.remove(key.as_str()));
            }
            _ => {}
        }
    }
    if let Some(tokens) = value.pointer_mut("/server/tokens").and_then(Value::as_array_mut) {
        // From the last, so that the indexes still point at their entries.
        for &index in entries.iter().rev() {
            if index < tokens.len() {
                tokens.remove(index);
            }
        }
    }
    expansion.missing.retain(|m| !is_token(&m.path));
}

fn secrets_of(expansion: &expand::Expansion, value: &Value) -> redact::Redactor {
    let mut secrets = redact::Redactor::default();
    for r in &expansion.refs {
        secrets.add(&r.value, &format!("${{{}}}", r.var));
    }
    // `key` is the dotted key as problems name it; `label` how a redacted value is shown.
    let mut literal = |key: String, label: String, v: Option<&Value>| {
        // A value still holding an unset `${VAR}` is the text of the file, not a secret.
        if expansion.missing.iter().any(|m| m.key == key) {
            return;
        }
        if let Some(text) = v.and_then(Value::as_str) {
            secrets.add(text, &label);
        }
    };
    let same = |key: &str| (key.to_string(), key.to_string());
    let (key, label) = same("server.auth_token");
    literal(key, label, value.pointer("/server/auth_token"));
    for (i, entry) in value.pointer("/server/tokens").and_then(Value::as_array).into_iter().flatten().enumerate() {
        literal(format!("server.tokens.{i}.token"), format!("server.tokens[{i}].token"), entry.get("token"));
    }
    let (key, label) = same("embedding.api_key");
    literal(key, label, value.pointer("/embedding/api_key"));
    let (key, label) = same("chat.api_key");
    literal(key, label, value.pointer("/chat/api_key"));
    let (key, label) = same("approval.approver_token");
    literal(key, label, value.pointer("/approval/approver_token"));
    for (name, server) in value.pointer("/mcp/servers").and_then(Value::as_object).into_iter().flatten() {
        for (table, secret) in
            [("env", redact::is_secret_key as fn(&str) -> bool), ("headers", upstream::is_secret_header)]
        {
            for (key, v) in server.get(table).and_then(Value::as_object).into_iter().flatten() {
                if secret(key) {
                    let (key, label) = same(&format!("mcp.servers.{name}.{table}.{key}"));
                    literal(key, label, Some(v));
                }
            }
        }
    }
    for kind in [ScriptKind::Connector, ScriptKind::Tool, ScriptKind::Agent] {
        let sections =
            split(kind.section()).iter().try_fold(value, |node, key| node.get(key)).and_then(Value::as_object);
        for (name, section) in sections.into_iter().flatten() {
            for (key, v) in section.as_object().into_iter().flatten() {
                if redact::is_secret_key(key) && !reserved_script_keys().contains(key) {
                    let (key, label) = same(&format!("{}.{name}.{key}", kind.section()));
                    literal(key, label, Some(v));
                }
            }
        }
    }
    // A literal credential in a server's URL (`?api_key=...`): reqwest's errors, which rmcp
    // logs, quote the URL.
    for (name, server) in value.pointer("/mcp/servers").and_then(Value::as_object).into_iter().flatten() {
        let key = format!("mcp.servers.{name}.url");
        let url = server.get("url").and_then(Value::as_str).filter(|_| !expansion.missing.iter().any(|m| m.key == key));
        for credential in url.map(upstream::url_credentials).unwrap_or_default() {
            secrets.add(credential, &key);
        }
    }
    secrets
}

/// A config problem that shows no secret: the value of an expanded key is never echoed, however
/// short (a schema message quotes it, or a cut of it), and longer secrets go wherever they are.
fn hide_secrets(
    mut problem: ConfigProblem,
    expansion: &expand::Expansion,
    secrets: &redact::Redactor,
) -> ConfigProblem {
    for (key, value) in &expansion.values {
        let about = problem.key == *key || problem.key.starts_with(&format!("{key}.")) || problem.key.starts_with('(');
        if !about {
            continue;
        }
        let vars: Vec<&str> = expansion.refs.iter().filter(|r| r.key == *key).map(|r| r.var.as_str()).collect();
        let label = match vars.as_slice() {
            [var] => format!("${{{var}}}"),
            _ => key.clone(),
        };
        problem.message = hide_value(&problem.message, value, &label);
    }
    problem.message = secrets.apply(&problem.message).into_owned();
    problem
}

/// `message` without `value` as a schema message renders it: JSON-quoted, whole or cut short
/// and followed by `...`.
fn hide_value(message: &str, value: &str, label: &str) -> String {
    let replacement = format!("\"[redacted {label}]\"");
    let quoted = serde_json::to_string(value).unwrap_or_default();
    if message.contains(&quoted) {
        return message.replace(&quoted, &replacement);
    }
    let chars: Vec<char> = quoted.chars().collect();
    // A cut keeps the opening quote and at least a few characters; messages cut values at
    // about 60 characters, so longer prefixes are not worth trying.
    for n in (5..chars.len().min(200)).rev() {
        let cut = format!("{}...", chars[..n].iter().collect::<String>());
        if message.contains(&cut) {
            return message.replace(&cut, &replacement);
        }
    }
    message.to_string()
}

/// `allow_hosts` entries that look like a CIDR range and are not one, in script sections and
/// in `[code_mode]`.
/// `CTX_DATABASE_URL` wins over `[db] url`: one config file serves a laptop (SQLite) and a
/// deployment (the variable set on each replica).
fn database_from_env(value: &mut Value, env: &dyn Fn(&str) -> Option<String>) {
    let Some(url) = env(crate::db::URL_ENV).filter(|u| !u.trim().is_empty()) else { return };
    let Some(root) = value.as_object_mut() else { return };
    let db = root.entry("db").or_insert_with(|| Value::Object(Default::default()));
    if let Some(db) = db.as_object_mut() {
        db.insert("url".into(), Value::String(url));
    }
}

/// The database password, from the URL or `PGPASSWORD`: hidden in every log and error like the
/// config's other secrets.
fn database_secret(value: &Value, env: &dyn Fn(&str) -> Option<String>, secrets: &mut redact::Redactor) {
    if let Some(url) = value.pointer("/db/url").and_then(Value::as_str) {
        let password = env("PGPASSWORD");
        if let Ok(parsed) = crate::db::DbUrl::parse(url, password.as_deref()) {
            if let Some(password) = parsed.password() {
                secrets.add(&password, "the database password");
            }
        }
    }
}

/// `[db] url` must be a PostgreSQL URL ctx can use; the problem says what to write.
fn database_problems(value: &Value, text: &str) -> Vec<(Vec<String>, ConfigProblem)> {
    let Some(url) = value.pointer("/db/url").and_then(Value::as_str) else { return Vec::new() };
    match crate::db::DbUrl::parse(url, None) {
        Ok(_) => Vec::new(),
        Err(message) => {
            let path = vec!["db".to_string(), "url".to_string()];
            let line = toml_source::line_of(text, &path);
            vec![(path, ConfigProblem { key: "db.url".into(), line, message })]
        }
    }
}

fn host_rule_problems(value: &Value, text: &str) -> Vec<(Vec<String>, ConfigProblem)> {
    let mut sections: Vec<(Vec<String>, &Value)> = Vec::new();
    for kind in [ScriptKind::Connector, ScriptKind::Tool, ScriptKind::Agent] {
        let table = split(kind.section()).iter().try_fold(value, |node, key| node.get(key)).and_then(Value::as_object);
        for (name, section) in table.into_iter().flatten() {
            let mut path = split(kind.section());
            path.push(name.clone());
            sections.push((path, section));
        }
    }
    sections.extend(value.get("code_mode").map(|section| (split("code_mode"), section)));
    let mut problems = Vec::new();
    for (at, section) in sections {
        let entries = section.get("allow_hosts").and_then(Value::as_array);
        for (i, entry) in entries.into_iter().flatten().enumerate() {
            let Some(entry) = entry.as_str() else { continue };
            if let Err(message) = hosts::HostRule::parse(entry) {
                let mut path = at.clone();
                path.extend(["allow_hosts".into(), i.to_string()]);
                let key = path.join(".");
                problems.push((path.clone(), ConfigProblem { line: toml_source::line_of(text, &path), message, key }));
            }
        }
    }
    problems
}

/// The variables used outside the section at `prefix` (`tools.script.jira.`), each with the
/// first key that uses it.
fn reserved_for(prefix: &str, refs: &[expand::VarRef]) -> Vec<ReservedVar> {
    let mut out: Vec<ReservedVar> = Vec::new();
    for r in refs.iter().filter(|r| !r.key.starts_with(prefix)) {
        if !out.iter().any(|o| o.var == r.var) {
            out.push(ReservedVar { var: r.var.clone(), key: r.key.clone() });
        }
    }
    out.sort_by(|a, b| a.var.cmp(&b.var));
    out
}

fn script_sections(
    value: &Value,
    spec: &types::Config,
    base_dir: &Path,
    refs: &[expand::VarRef],
) -> Vec<ScriptSection> {
    let groups: [(ScriptKind, &BTreeMap<types::ExtensionName, types::ScriptSectionConfig>); 3] = [
        (ScriptKind::Connector, &spec.connectors.script),
        (ScriptKind::Tool, &spec.tools.script),
        (ScriptKind::Agent, &spec.agents.script),
    ];
    let mut out = Vec::new();
    for (kind, sections) in groups {
        for (name, section) in sections {
            let raw = split(kind.section())
                .iter()
                .try_fold(value, |node, key| node.get(key))
                .and_then(|n| n.get(name.as_str()))
                .and_then(Value::as_object);
            let config = raw
                .map(|m| {
                    m.iter()
                        .filter(|(k, _)| !reserved_script_keys().contains(k))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default();
            let path = Path::new(section.path.as_str());
            out.push(ScriptSection {
                kind,
                name: name.to_string(),
                path: if path.is_absolute() { path.to_path_buf() } else { base_dir.join(path) },
                display_path: section.path.to_string(),
                timeout: section.timeout.map(Duration::from_secs).unwrap_or(kind.default_timeout()),
                memory_limit_bytes: (section.memory_mb as usize).saturating_mul(1024 * 1024),
                max_result_bytes: section.max_result_bytes.max(0) as usize,
                allow_hosts: non_empty(section.allow_hosts.iter().map(|s| s.to_string())),
                allow_env: non_empty(section.allow_env.iter().map(|s| s.to_string())),
                allow_private: section.allow_private,
                long_running: section.long_running,
                reserved_env: reserved_for(&format!("{}.{}.", kind.section(), name.as_str()), refs),
                config,
            });
        }
    }
    out
}

/// `None` for an empty list: the schema requires at least one item, so empty means "not set".
fn non_empty(items: impl Iterator<Item = String>) -> Option<Vec<String>> {
    let list: Vec<String> = items.collect();
    (!list.is_empty()).then_some(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Config, ConfigError> {
        let env = |name: &str| (name == "JIRA_TOKEN").then(|| "tok".to_string());
        Config::from_text(text, Path::new("ctx.toml"), Path::new("/w/ctx.toml"), &env)
    }

    #[test]
    fn empty_config_takes_defaults() {
        let config = load("").unwrap();
        assert_eq!(config.db_path(), PathBuf::from("/w/data/ctx.sqlite"));
        assert_eq!(config.spec.server.bind.as_str(), "127.0.0.1:7391");
        assert_eq!(config.spec.retrieval.default_limit, 12);
    }

    #[test]
    fn script_sections_keep_free_keys_expanded() {
        let config = load("[tools.script.jira]\npath = \"tools/jira.lua\"\ntimeout = 5\nurl = \"https://x\"\ntoken = \"${JIRA_TOKEN}\"\n").unwrap();
        let jira = &config.scripts[0];
        assert_eq!(jira.kind, ScriptKind::Tool);
        assert_eq!(jira.path, PathBuf::from("/w/tools/jira.lua"));
        assert_eq!(jira.timeout, Duration::from_secs(5));
        assert_eq!(jira.config.get("token").unwrap(), "tok");
        assert!(!jira.config.contains_key("path"));
        assert!(!jira.config.contains_key("timeout"));
    }

    #[test]
    fn variables_used_outside_a_section_are_reserved_from_it() {
        let env = |name: &str| (name != crate::db::URL_ENV).then(|| format!("value-of-{name}"));
        let text = "[server]\nauth_token = \"${TOKEN}-and-more\"\n\n[tools.script.a]\npath = \"a.lua\"\nmine = \"${MINE}\"\nalso = \"${TOKEN}\"\n\n[tools.script.b]\npath = \"b.lua\"\nkey = \"${B_KEY}\"\n";
        let config = Config::from_text(text, Path::new("ctx.toml"), Path::new("/w/ctx.toml"), &env).unwrap();
        let reserved = |name: &str| -> Vec<(String, String)> {
            let section = config.scripts.iter().find(|s| s.name == name).unwrap();
            section.reserved_env.iter().map(|r| (r.var.clone(), r.key.clone())).collect()
        };
        // The token stays reserved even where the section uses it too; a section's own variable
        // is not reserved from it.
        assert_eq!(
            reserved("a"),
            [("B_KEY".to_string(), "tools.script.b.key".to_string()), ("TOKEN".into(), "server.auth_token".into())]
        );
        assert_eq!(
            reserved("b"),
            [("MINE".to_string(), "tools.script.a.mine".to_string()), ("TOKEN".into(), "server.auth_token".into())]
        );
    }

    #[test]
    fn hide_value_covers_whole_and_cut_renderings() {
        assert_eq!(hide_value("got \"ab\"", "ab", "${X}"), "got \"[redacted ${X}]\"");
        let long = "x".repeat(80);
        let cut = format!("got \"{}...", "x".repeat(56));
        assert_eq!(hide_value(&cut, &long, "${X}"), "got \"[redacted ${X}]\"");
        assert_eq!(hide_value("unrelated", &long, "${X}"), "unrelated");
    }

    #[test]
    fn an_unset_variable_disables_only_its_script_section() {
        let text = "[tools.script.jira]\npath = \"j.lua\"\ntoken = \"${NOPE}\"\nallow_hosts = [\"${NOPE_HOST}\"]\n\n[tools.script.ok]\npath = \"ok.lua\"\n\n[agents.inline.a]\ndescription = \"${NOPE}\"\nsystem_prompt = \"hi\"\n";
        let config = load(text).unwrap();
        assert_eq!(config.scripts.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["ok"]);
        assert!(!config.spec.tools.script.keys().any(|k| k.as_str() == "jira"));
        assert!(config.spec.agents.inline.is_empty());
        let broken: Vec<(String, SectionKind)> = config.broken.iter().map(|b| (b.section(), b.kind)).collect();
        assert_eq!(
            broken,
            [
                ("tools.script.jira".to_string(), SectionKind::Script(ScriptKind::Tool)),
                ("agents.inline.a".into(), SectionKind::Script(ScriptKind::Agent))
            ]
        );
        let message = config.broken[0].message();
        assert!(
            message.starts_with("ctx.toml: tools.script.jira.token (line 3): environment variable NOPE is not set"),
            "{message}"
        );
        // The host rule that cannot parse `${NOPE_HOST}` belongs to the disabled section too.
        assert!(message.contains("allow_hosts.0 (line 4)"), "{message}");
    }

    #[test]
    fn an_unset_variable_in_a_core_section_is_still_fatal() {
        let err = load("[embedding]\napi_key = \"${NOPE}\"\n[tools.script.ok]\npath = \"ok.lua\"\n").unwrap_err();
        assert!(err.to_string().contains("embedding.api_key (line 2): environment variable NOPE is not set"), "{err}");
        // A schema problem in a section without an unset variable stays fatal as well.
        let err = load("[tools.script.a]\npath = \"a.lua\"\ntimeout = \"x\"\n[tools.script.b]\npath = \"${NOPE}\"\n")
            .unwrap_err();
        assert!(err.to_string().contains("tools.script.a.timeout (line 3)"), "{err}");
    }

    #[test]
    fn reports_every_problem_with_key_and_line() {
        let err =
            load("[db]\npth = 1\n\n[tools.script.jira]\npath = \"j.lua\"\ntimeout = \"30s\"\nkey = \"${NOPE}\"\n")
                .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("tools.script.jira.timeout (line 6): expected integer between 1 and 86400, got \"30s\""),
            "{text}"
        );
        assert!(text.contains("db.pth (line 2): unknown key; expected one of: path"), "{text}");
        assert!(text.contains("tools.script.jira.key (line 7): environment variable NOPE is not set"), "{text}");
    }
}
