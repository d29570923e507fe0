//! `mcp.import`: a Claude Desktop / Cursor style `{"mcpServers": {...}}` file, read as it is.
//!
//! Users already keep their servers in `claude_desktop_config.json` or `.cursor/mcp.json`, and
//! pointing ctx at that file beats copying it. The file is not ctx's own format and other
//! clients read it too, so an entry ctx cannot use (an unset variable, an `"sse"` server, a name
//! that cannot prefix tool names) is disabled on its own, like an isolated `ctx.toml` section.
//! Only a file that cannot be read or parsed fails the config.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{Map, Value};

use super::broken::{BrokenSection, SectionKind};
use super::expand::{self, Syntax};
use super::redact::{self, Redactor};
use super::upstream::{self, Expose, UpstreamSection, UpstreamTransport, DEFAULT_TIMEOUT};
use super::ConfigProblem;

/// The key that holds the servers, in both clients' files.
const SERVERS: &str = "mcpServers";

/// What an imported entry takes from ctx.toml's `[mcp]`.
pub(super) struct Defaults<'a> {
    /// The names passed through from ctx's environment (`mcp.pass_env` or the default list).
    pub pass_env: &'a [String],
    /// `mcp.expose`.
    pub expose: Expose,
}

/// The servers of an imported file.
#[derive(Debug, Default)]
pub(super) struct Imported {
    pub servers: Vec<UpstreamSection>,
    /// Entries ctx cannot use, each disabled on its own.
    pub broken: Vec<BrokenSection>,
    /// Entries that `ctx.toml` defines too, and therefore ignored.
    pub warnings: Vec<String>,
    /// The values its `${VAR}`s expanded to, and its literal secrets.
    pub secrets: Redactor,
    /// Its `${VAR}`s, keyed `mcpServers.<name>...`: a Lua script's `env.get` never reads them.
    pub refs: Vec<expand::VarRef>,
}

/// Reads the file `written` (as `mcp.import` gives it) names. `defined` are the names of
/// `ctx.toml`'s own `[mcp.servers.*]`, which win over an entry of the same name. The error is
/// the message of a problem at `mcp.import`: the file, where, and what to do.
pub(super) fn read(
    written: &str,
    base_dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    defaults: &Defaults<'_>,
    defined: &BTreeSet<String>,
    config_shown: &str,
) -> Result<Imported, String> {
    let path = upstream::resolve_path(written, base_dir, env)?;
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "the file to import, {written} ({}), does not exist; point mcp.import at your claude_desktop_config.json or .cursor/mcp.json (relative to the config file's folder, or ~/...), or remove it",
                path.display()
            ))
        }
        Err(e) => {
            return Err(format!("cannot read the file to import, {written} ({}): {e}; fix its permissions or remove mcp.import", path.display()))
        }
    };
    let root: Value = serde_json::from_str(&text).map_err(|e| {
        let message = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        format!(
            "{written}: invalid JSON at line {}, column {}: {}; fix the file (ctx reads it as Claude Desktop and Cursor do, {{\"mcpServers\": {{...}}}}) or remove mcp.import",
            e.line(),
            e.column(),
            message.strip_suffix(&suffix).unwrap_or(&message)
        )
    })?;
    let Some(mut servers) = root.get(SERVERS).and_then(Value::as_object).cloned().map(Value::Object) else {
        return Err(format!(
            "{written} has no \"mcpServers\" object; ctx imports Claude Desktop / Cursor style files, {{\"mcpServers\": {{\"<name>\": {{\"command\": ...}}}}}}"
        ));
    };
    let expansion = expand::expand_all_as(&mut servers, env, Syntax::Imported);
    let mut imported = Imported::default();
    for r in &expansion.refs {
        imported.secrets.add(&r.value, &format!("${{{}}}", r.var));
    }
    imported.refs =
        expansion.refs.iter().map(|r| expand::VarRef { key: format!("{SERVERS}.{}", r.key), ..r.clone() }).collect();
    let base = path.parent().unwrap_or(base_dir);
    for (name, entry) in servers.as_object().into_iter().flatten() {
        if defined.contains(name) {
            imported.warnings.push(format!(
                "{config_shown}: [mcp.servers.{name}] overrides the server {name:?} of the imported file {written}; the imported definition is ignored"
            ));
            continue;
        }
        let key = |suffix: &[&str]| key_of(name, suffix);
        let mut problems: Vec<ConfigProblem> = expansion
            .missing
            .iter()
            .filter(|m| m.path.first() == Some(name))
            .map(|m| ConfigProblem {
                key: key(&m.path[1..].iter().map(String::as_str).collect::<Vec<_>>()),
                line: None,
                message: format!("environment variable {} is not set (referenced as ${{{}}})", m.var, m.var),
            })
            .collect();
        let unresolved: BTreeSet<&str> = expansion
            .missing
            .iter()
            .filter(|m| m.path.first() == Some(name))
            .filter_map(|m| m.path.get(1))
            .map(String::as_str)
            .collect();
        match entry_of(name, entry, base, env, defaults, &unresolved, &mut imported.secrets) {
            Ok(section) if problems.is_empty() => {
                imported.servers.push(UpstreamSection { origin: written.to_string(), ..section })
            }
            Ok(_) => {}
            Err(found) => problems.extend(found.into_iter().map(|(suffix, message)| ConfigProblem {
                key: key(&suffix),
                line: None,
                message,
            })),
        }
        if !problems.is_empty() {
            imported.broken.push(BrokenSection {
                refused: false,
                kind: SectionKind::Upstream,
                table: SERVERS.to_string(),
                name: name.clone(),
                path: None,
                file: written.to_string(),
                problems,
            });
        }
    }
    Ok(imported)
}

/// `mcpServers.<name>.<suffix>`, a name that is not a bare word quoted.
fn key_of(name: &str, suffix: &[&str]) -> String {
    let bare = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    std::iter::once(SERVERS)
        .chain(std::iter::once(name))
        .chain(suffix.iter().copied())
        .map(|s| if bare(s) { s.to_string() } else { format!("{s:?}") })
        .collect::<Vec<_>>()
        .join(".")
}

type EntryProblems = Vec<(Vec<&'static str>, String)>;

/// One entry as an upstream section, or its problems (each with its key below the entry).
/// Keys neither client defines for ctx (`autoApprove`, `alwaysAllow`, ...) are ignored.
fn entry_of(
    name: &str,
    entry: &Value,
    base: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    defaults: &Defaults<'_>,
    unresolved: &BTreeSet<&str>,
    secrets: &mut Redactor,
) -> Result<UpstreamSection, EntryProblems> {
    let mut problems: EntryProblems = Vec::new();
    if !upstream::is_server_name(name) {
        problems.push((
            vec![],
            "this name cannot prefix tool names (<server>__<tool>): use 1 to 32 letters, digits, '_', '.' or '-', starting with a letter or digit; rename it in the file, or define the server in ctx.toml under such a name".into(),
        ));
    }
    let Some(entry) = entry.as_object() else {
        problems.push((vec![], "expected an object such as {\"command\": \"npx\", \"args\": [...]}".into()));
        return Err(problems);
    };
    match entry.get("type") {
        None => {}
        Some(Value::String(t)) if t == "sse" => problems.push((
            vec!["type"],
            "\"sse\" is the old HTTP+SSE transport, which ctx does not speak: ctx connects over Streamable HTTP. If the server offers it (often at /mcp), set that url and \"type\": \"http\", or define the server in ctx.toml".into(),
        )),
        Some(Value::String(t)) if matches!(t.as_str(), "stdio" | "http" | "streamable-http" | "streamableHttp") => {}
        Some(other) => problems.push((
            vec!["type"],
            format!("unknown type {other}; expected \"stdio\", \"http\" or \"streamable-http\""),
        )),
    }
    let text = |key: &'static str, problems: &mut EntryProblems| match entry.get(key) {
        None => None,
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(_) => {
            problems.push((vec![key], "expected a non-empty string".into()));
            None
        }
    };
    let command = text("command", &mut problems);
    let url = text("url", &mut problems);
    let enabled = !entry.get("disabled").and_then(Value::as_bool).unwrap_or(false);
    let transport = match (command, url) {
        (Some(_), Some(_)) => {
            problems.push((vec![], "sets both command and url; keep one".into()));
            None
        }
        (None, None) if !entry.contains_key("command") && !entry.contains_key("url") => {
            problems.push((vec![], "sets neither command nor url; ctx needs one of them to reach the server".into()));
            None
        }
        (None, None) => None,
        (Some(command), None) => {
            let args = match entry.get("args") {
                None => Vec::new(),
                Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
                    items.iter().filter_map(Value::as_str).map(str::to_owned).collect()
                }
                Some(_) => {
                    problems.push((vec!["args"], "expected an array of strings".into()));
                    Vec::new()
                }
            };
            let own = string_map(entry, "env", &mut problems);
            for (key, value) in &own {
                if redact::is_secret_key(key) {
                    secrets.add(value, &key_of(name, &["env", key]));
                }
            }
            let cwd = match text("cwd", &mut problems).map(|cwd| upstream::resolve_path(&cwd, base, env)) {
                Some(Ok(cwd)) => Some(cwd),
                Some(Err(message)) => {
                    problems.push((vec!["cwd"], message));
                    None
                }
                None => None,
            };
            let pass = defaults.pass_env.iter().map(String::as_str);
            Some(UpstreamTransport::Stdio { command, args, env: upstream::child_env(own, pass, env), cwd })
        }
        (None, Some(url)) => {
            if !unresolved.contains("url") {
                if let Err(message) = upstream::check_url(&url) {
                    problems.push((vec!["url"], message));
                }
            }
            for credential in upstream::url_credentials(&url) {
                secrets.add(credential, &key_of(name, &["url"]));
            }
            let headers = string_map(entry, "headers", &mut problems);
            for key in headers.keys().filter(|k| !upstream::is_header_name(k)) {
                problems.push((vec!["headers"], format!("{key:?} is not an HTTP header name")));
            }
            for (key, value) in &headers {
                if upstream::is_secret_header(key) {
                    secrets.add(value, &key_of(name, &["headers", key]));
                }
            }
            Some(UpstreamTransport::Http { url, headers })
        }
    };
    match transport {
        Some(transport) if problems.is_empty() => Ok(UpstreamSection {
            name: name.to_string(),
            transport,
            tools: Vec::new(),
            exclude: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            required: false,
            enabled,
            expose: defaults.expose,
            origin: String::new(),
        }),
        _ => Err(problems),
    }
}

/// `env` or `headers`: an object of strings. Numbers and booleans are taken as their text, as a
/// hand-written `"PORT": 8080` means.
fn string_map(entry: &Map<String, Value>, key: &'static str, problems: &mut EntryProblems) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    match entry.get(key) {
        None => {}
        Some(Value::Object(map)) => {
            for (k, v) in map {
                match v {
                    Value::String(s) => {
                        out.insert(k.clone(), s.clone());
                    }
                    Value::Number(_) | Value::Bool(_) => {
                        out.insert(k.clone(), v.to_string());
                    }
                    _ => problems.push((vec![key], format!("{k}: expected a string"))),
                }
            }
        }
        Some(_) => problems.push((vec![key], "expected an object of strings".into())),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn import(json: &str, vars: &[(&str, &str)]) -> Result<Imported, String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("mcp.json"), json).unwrap();
        let vars: BTreeMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let env = move |name: &str| vars.get(name).cloned();
        let pass_env = vec!["PATH".to_string()];
        let defaults = Defaults { pass_env: &pass_env, expose: Expose::All };
        read("mcp.json", dir.path(), &env, &defaults, &BTreeSet::from(["mine".to_string()]), "ctx.toml")
    }

    fn problems_of(imported: &Imported, name: &str) -> Vec<String> {
        let broken = imported.broken.iter().find(|b| b.name == name).unwrap_or_else(|| panic!("{name} not broken"));
        broken.problems.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn each_unusable_entry_is_disabled_alone_with_its_reason() {
        let json = r#"{"mcpServers": {
            "ok": {"command": "srv", "args": ["a"], "env": {"PORT": 8080, "DEBUG": true}},
            "both": {"command": "srv", "url": "https://h/mcp"},
            "neither": {"args": ["x"]},
            "odd type": {"type": "websocket", "url": "https://h/mcp"},
            "badargs": {"command": "srv", "args": "--flag"},
            "badheader": {"url": "https://h/mcp", "headers": {"Bad Header": "v"}},
            "notanobject": "npx server",
            "mine": {"command": "ignored"}
        }}"#;
        let imported = import(json, &[("PATH", "/bin")]).unwrap();
        assert!(imported.servers.iter().map(|s| s.name.as_str()).eq(["ok"]));
        let UpstreamTransport::Stdio { env, .. } = &imported.servers[0].transport else { panic!() };
        let expected = [("DEBUG", "true"), ("PATH", "/bin"), ("PORT", "8080")];
        assert_eq!(env, &expected.map(|(k, v)| (k.to_string(), v.to_string())).into_iter().collect());
        assert_eq!(imported.servers[0].origin, "mcp.json");
        assert_eq!(problems_of(&imported, "both"), ["mcpServers.both: sets both command and url; keep one"]);
        assert!(problems_of(&imported, "neither")[0].contains("sets neither command nor url"));
        let odd = problems_of(&imported, "odd type");
        assert!(odd[0].starts_with("mcpServers.\"odd type\": this name cannot prefix tool names"), "{odd:?}");
        assert!(odd[1].starts_with("mcpServers.\"odd type\".type: unknown type \"websocket\""), "{odd:?}");
        assert_eq!(problems_of(&imported, "badargs"), ["mcpServers.badargs.args: expected an array of strings"]);
        assert!(problems_of(&imported, "badheader")[0].contains("\"Bad Header\" is not an HTTP header name"));
        assert!(problems_of(&imported, "notanobject")[0].contains("expected an object"));
        // ctx.toml defines "mine": not imported, not broken, one warning.
        assert!(!imported.broken.iter().any(|b| b.name == "mine"));
        assert_eq!(imported.warnings.len(), 1);
        assert!(imported.broken.iter().all(|b| b.file == "mcp.json" && b.table == "mcpServers"));
    }

    #[test]
    fn expanded_and_literal_secrets_are_registered() {
        let json = r#"{"mcpServers": {
            "gh": {"command": "srv", "env": {"GITHUB_TOKEN": "ghp_literal_value", "MODE": "plain-value"}},
            "web": {"url": "https://h/mcp", "headers": {"X-Api-Key": "${env:KEY_VAR}", "Accept": "text/plain-long"}}
        }}"#;
        let imported = import(json, &[("KEY_VAR", "expanded-secret")]).unwrap();
        let shown = imported.secrets.apply("ghp_literal_value expanded-secret plain-value text/plain-long");
        assert_eq!(
            shown,
            "[redacted mcpServers.gh.env.GITHUB_TOKEN] [redacted ${KEY_VAR}] plain-value text/plain-long"
        );
    }

    #[test]
    fn file_problems_say_what_to_do() {
        let err = import("[1, 2]", &[]).unwrap_err();
        assert!(err.contains("mcp.json has no \"mcpServers\" object"), "{err}");
        let err = import("{\"mcpServers\": {}", &[]).unwrap_err();
        assert!(err.starts_with("mcp.json: invalid JSON at line 1, column 17: EOF while parsing an object"), "{err}");
        let imported = import("{\"mcpServers\": {}}", &[]).unwrap();
        assert!(imported.servers.is_empty() && imported.broken.is_empty());
    }
}
