//! `[mcp]`: the upstream MCP servers ctx connects to, resolved from `ctx.toml` and from an
//! imported Claude Desktop / Cursor style `{"mcpServers": {...}}` file (see `mcp_import`).
//!
//! The types below are the contract between the config layer, the upstream runtime
//! (`crate::upstream`) and the registry. A child's environment is built here, once: the
//! section's `env` plus an allow-list of names read through the config's environment lookup,
//! so nothing else of ctx's environment (its secrets) reaches an upstream.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::{toml_source, ConfigProblem};
use crate::types;

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
        /// Absolute. A ctx.toml section without `cwd` gets the config file's folder; an imported
        /// entry without one (`None`) runs where ctx runs, as its own client would run it.
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
    /// Whether the upstream tool `tool` passes `tools` and `exclude` (one name; a list goes
    /// through [`UpstreamSection::tool_filter`]).
    pub fn allows(&self, tool: &str) -> bool {
        self.tool_filter()(tool)
    }

    /// Whether an upstream tool's name passes `tools` and `exclude`: the globs are compiled
    /// once per call of this, not once per tool (a relist filters up to thousands of names).
    pub fn tool_filter(&self) -> impl Fn(&str) -> bool {
        let set = |globs: &[String]| {
            let mut builder = globset::GlobSetBuilder::new();
            // The schema check refused invalid globs already.
            for glob in globs.iter().filter_map(|g| globset::Glob::new(g).ok()) {
                builder.add(glob);
            }
            builder.build().unwrap_or_else(|_| globset::GlobSet::empty())
        };
        let (allow, deny, all) = (set(&self.tools), set(&self.exclude), self.tools.is_empty());
        move |tool| (all || allow.is_match(tool)) && !deny.is_match(tool)
    }
}

/// The names every stdio child gets from ctx's environment: `mcp.pass_env` when the config sets
/// it (`[]` passes none), [`DEFAULT_PASS_ENV`] otherwise.
pub(super) fn global_pass_env(value: &Value) -> Vec<String> {
    match value.pointer("/mcp/pass_env").and_then(Value::as_array) {
        Some(names) => names.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        None => DEFAULT_PASS_ENV.iter().map(|s| s.to_string()).collect(),
    }
}

/// A child's whole environment: the passed-through names that are set, then `own` (the
/// section's `env`), which wins over a passed-through value of the same name.
pub(super) fn child_env<'a>(
    own: BTreeMap<String, String>,
    pass: impl IntoIterator<Item = &'a str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> =
        pass.into_iter().filter_map(|name| env(name).map(|value| (name.to_string(), value))).collect();
    out.extend(own);
    out
}

/// Whether `name` can prefix tool names (`<name>__<tool>`): the schema's `McpServerName`.
pub(super) fn is_server_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && name.len() <= 32
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// `Ok` for an `http://` or `https://` URL with a host.
pub(super) fn check_url(url: &str) -> Result<(), String> {
    let lower = url.to_ascii_lowercase();
    let Some(rest) = lower.strip_prefix("https://").or_else(|| lower.strip_prefix("http://")) else {
        // The scheme alone is shown: the rest of a URL can carry a credential.
        let scheme = lower.split_once("://").map(|(s, _)| s).filter(|s| s.len() <= 16);
        let got = scheme.map(|s| format!(", got a {s}:// URL")).unwrap_or_default();
        return Err(format!(
            "expected an http:// or https:// URL (ctx reaches upstream servers over Streamable HTTP){got}"
        ));
    };
    if rest.split(['/', '?', '#']).next().unwrap_or_default().is_empty() {
        return Err("expected a host after http:// or https://".to_string());
    }
    Ok(())
}

/// Whether `name` is an HTTP header name (an RFC 9110 token): the schema's `HttpHeaderName`.
pub(super) fn is_header_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+.^_`|~-".contains(c))
}

/// Whether an HTTP header's value is a credential, to be kept out of messages.
pub(super) fn is_secret_header(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    matches!(lower.as_str(), "authorization" | "proxy-authorization" | "cookie")
        || lower.contains("key")
        || super::redact::is_secret_key(&lower)
}

/// The parts of a URL that can carry a credential: the whole query and fragment, each query
/// value, and `user:password` of the authority. (reqwest's errors quote the URL they failed
/// on.)
pub fn url_secrets(url: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (before, fragment) = url.split_once('#').unwrap_or((url, ""));
    out.push(fragment);
    if let Some((_, query)) = before.split_once('?') {
        out.push(query);
        out.extend(query.split('&').filter_map(|pair| pair.split_once('=').map(|(_, v)| v)));
    }
    out.extend(url_credentials(url));
    out.retain(|s| !s.is_empty());
    out
}

/// The credentials of a URL, to hide from every log line and message: the values of query
/// parameters named like a secret (`api_key`, `token`, ...) and the password of
/// `user:password@`. (Ordinary parameters such as `format=json` stay readable.)
pub(super) fn url_credentials(url: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let before = url.split_once('#').map_or(url, |(b, _)| b);
    let (head, query) = before.split_once('?').unwrap_or((before, ""));
    for (name, value) in query.split('&').filter_map(|pair| pair.split_once('=')) {
        if is_secret_header(name) || name.eq_ignore_ascii_case("sig") || name.eq_ignore_ascii_case("auth") {
            out.push(value);
        }
    }
    let authority = head.split_once("://").map_or(head, |(_, rest)| rest).split('/').next().unwrap_or_default();
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        out.extend(userinfo.split_once(':').map(|(_, password)| password));
    }
    out.retain(|s| !s.is_empty());
    out
}

/// `Ok` for a glob `tools` or `exclude` can hold.
pub(super) fn check_glob(glob: &str) -> Result<(), String> {
    globset::Glob::new(glob).map(|_| ()).map_err(|e| format!("not a valid glob pattern: {}", e.kind()))
}

/// `path` from a config: `~/` is the home folder (`$HOME`), a relative path is relative to `base`.
pub(super) fn resolve_path(path: &str, base: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<PathBuf, String> {
    let home = || env("HOME").filter(|h| !h.is_empty());
    let resolved = if path == "~" {
        PathBuf::from(home().ok_or("cannot expand ~: HOME is not set; write the full path")?)
    } else if let Some(rest) = path.strip_prefix("~/") {
        PathBuf::from(home().ok_or("cannot expand ~/: HOME is not set; write the full path")?).join(rest)
    } else if Path::new(path).is_absolute() {
        PathBuf::from(path)
    } else {
        base.join(path)
    };
    Ok(std::path::absolute(&resolved).unwrap_or(resolved))
}

/// The keys only a stdio server takes, and the ones only an HTTP server takes.
const STDIO_ONLY: [&str; 4] = ["args", "env", "cwd", "pass_env"];
const HTTP_ONLY: [&str; 1] = ["headers"];

/// What the schema cannot say about `[mcp.servers.*]`: exactly one of `command` and `url`, an
/// http(s) `url`, no key of the other transport, valid globs. `unresolved` tells the keys that
/// still hold an unset `${VAR}`: their value says nothing yet.
pub(super) fn section_problems(
    value: &Value,
    text: &str,
    unresolved: &dyn Fn(&str) -> bool,
) -> Vec<(Vec<String>, ConfigProblem)> {
    let mut problems = Vec::new();
    let servers = value.pointer("/mcp/servers").and_then(Value::as_object);
    for (name, section) in servers.into_iter().flatten() {
        let Some(section) = section.as_object() else { continue };
        let path = |keys: &[&str]| {
            let mut path = vec!["mcp".to_string(), "servers".into(), name.clone()];
            path.extend(keys.iter().map(|k| k.to_string()));
            path
        };
        let mut push = |keys: &[&str], message: String| {
            let path = path(keys);
            let key = path.join(".");
            problems.push((path.clone(), ConfigProblem { key, line: toml_source::line_of(text, &path), message }));
        };
        match (section.get("command"), section.get("url")) {
            (Some(_), Some(_)) => push(
                &[],
                "sets both command and url; a server is either a child process (command, args, env) or a Streamable HTTP endpoint (url, headers): keep one".into(),
            ),
            (None, None) => push(
                &[],
                "sets neither command nor url; give command (and args) to run a stdio server, or url for a Streamable HTTP server".into(),
            ),
            (Some(_), None) => {
                for key in HTTP_ONLY.iter().filter(|k| section.contains_key(**k)) {
                    push(&[key], format!("{key} applies to a url server only; this server runs command"));
                }
            }
            (None, Some(url)) => {
                for key in STDIO_ONLY.iter().filter(|k| section.contains_key(**k)) {
                    push(&[key], format!("{key} applies to a command server only; this server is reached at url"));
                }
                let key = path(&["url"]).join(".");
                if let Some(Err(message)) = url.as_str().filter(|_| !unresolved(&key)).map(check_url) {
                    push(&["url"], message);
                }
            }
        }
        for list in ["tools", "exclude"] {
            let globs = section.get(list).and_then(Value::as_array);
            for (i, glob) in globs.into_iter().flatten().enumerate() {
                let index = i.to_string();
                if let Some(Err(message)) =
                    glob.as_str().filter(|_| !unresolved(&format!("mcp.servers.{name}.{list}.{i}"))).map(check_glob)
                {
                    push(&[list, &index], message);
                }
            }
        }
    }
    problems
}

/// The usable `[mcp.servers.*]` of a validated config (the disabled ones were taken out of it),
/// and the problems found resolving them.
pub(super) fn from_spec(
    spec: &types::McpConfig,
    pass_env: &[String],
    base_dir: &Path,
    origin: &str,
    env: &dyn Fn(&str) -> Option<String>,
    text: &str,
) -> (Vec<UpstreamSection>, Vec<ConfigProblem>) {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for (name, section) in &spec.servers {
        let transport = match (&section.command, &section.url) {
            (Some(command), None) => {
                let cwd = match section.cwd.as_deref().map(|cwd| resolve_path(cwd, base_dir, env)).transpose() {
                    // Like every relative path in ctx.toml, a relative command or argument is
                    // taken from the config file's folder unless `cwd` says otherwise.
                    Ok(cwd) => cwd.or_else(|| Some(base_dir.to_path_buf())),
                    Err(message) => {
                        let path = ["mcp", "servers", name.as_str(), "cwd"].map(String::from);
                        let line = toml_source::line_of(text, &path);
                        problems.push(ConfigProblem { key: path.join("."), line, message });
                        continue;
                    }
                };
                let own = section.env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
                let pass = pass_env.iter().map(String::as_str).chain(section.pass_env.iter().map(|n| n.as_str()));
                UpstreamTransport::Stdio {
                    command: command.to_string(),
                    args: section.args.clone(),
                    env: child_env(own, pass, env),
                    cwd,
                }
            }
            (None, Some(url)) => UpstreamTransport::Http {
                url: url.to_string(),
                headers: section.headers.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            },
            // `section_problems` refused these before the config was typed.
            _ => continue,
        };
        out.push(UpstreamSection {
            name: name.to_string(),
            transport,
            tools: section.tools.iter().map(|g| g.to_string()).collect(),
            exclude: section.exclude.iter().map(|g| g.to_string()).collect(),
            timeout: Duration::from_secs(section.timeout),
            required: section.required,
            enabled: section.enabled,
            expose: expose(section.expose.unwrap_or(spec.expose)),
            origin: origin.to_string(),
        });
    }
    (out, problems)
}

pub(super) fn expose(value: types::McpExpose) -> Expose {
    match value {
        types::McpExpose::All => Expose::All,
        types::McpExpose::Discover => Expose::Discover,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BrokenSection, Config, ConfigError};

    fn load(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let vars: BTreeMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let env = move |name: &str| vars.get(name).cloned();
        Config::from_text(text, Path::new("ctx.toml"), Path::new("/w/ctx.toml"), &env)
    }

    fn env_of(section: &UpstreamSection) -> &BTreeMap<String, String> {
        match &section.transport {
            UpstreamTransport::Stdio { env, .. } => env,
            other => panic!("not stdio: {other:?}"),
        }
    }

    #[test]
    fn stdio_and_http_servers_resolve_sorted_with_defaults() {
        let text = "[mcp.servers.web]\nurl = \"https://mcp.example.com/mcp\"\nheaders = { Authorization = \"Bearer ${TOKEN}\" }\nexpose = \"discover\"\n\n[mcp.servers.files]\ncommand = \"npx\"\nargs = [\"-y\", \"server-filesystem\"]\ncwd = \"srv\"\ntools = [\"read_*\"]\nexclude = [\"read_secret\"]\ntimeout = 5\nrequired = true\n";
        let config = load(text, &[("TOKEN", "t0ken-value")]).unwrap();
        let names: Vec<&str> = config.upstreams.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["files", "web"]);
        let files = &config.upstreams[0];
        match &files.transport {
            UpstreamTransport::Stdio { command, args, cwd, .. } => {
                assert_eq!(command, "npx");
                assert_eq!(args, &["-y", "server-filesystem"]);
                assert_eq!(cwd.as_deref(), Some(Path::new("/w/srv")));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!((files.timeout, files.required, files.enabled), (Duration::from_secs(5), true, true));
        assert_eq!((files.expose, files.origin.as_str()), (Expose::All, "ctx.toml"));
        assert!(files.allows("read_file") && !files.allows("read_secret") && !files.allows("write_file"));
        let web = &config.upstreams[1];
        let headers = BTreeMap::from([("Authorization".to_string(), "Bearer t0ken-value".to_string())]);
        assert_eq!(web.transport, UpstreamTransport::Http { url: "https://mcp.example.com/mcp".into(), headers });
        assert_eq!((web.timeout, web.required, web.expose), (DEFAULT_TIMEOUT, false, Expose::Discover));
    }

    #[test]
    fn the_child_env_is_the_section_env_and_the_allow_list_only() {
        let vars = [("PATH", "/usr/bin"), ("HOME", "/home/u"), ("AWS_SECRET_ACCESS_KEY", "never"), ("EXTRA", "x")];
        let text = "[mcp.servers.a]\ncommand = \"a\"\nenv = { MINE = \"1\", HOME = \"/override\" }\n\n[mcp.servers.b]\ncommand = \"b\"\npass_env = [\"EXTRA\"]\n";
        let config = load(text, &vars).unwrap();
        let a = env_of(&config.upstreams[0]);
        let expected = [("HOME", "/override"), ("MINE", "1"), ("PATH", "/usr/bin")];
        assert_eq!(a, &expected.map(|(k, v)| (k.to_string(), v.to_string())).into_iter().collect());
        let b = env_of(&config.upstreams[1]);
        assert_eq!(b.get("EXTRA").map(String::as_str), Some("x"));
        assert!(!b.contains_key("AWS_SECRET_ACCESS_KEY"));
        // mcp.pass_env replaces the default list; a server's own pass_env still adds to it.
        let config = load(&format!("[mcp]\npass_env = []\n\n{text}"), &vars).unwrap();
        assert!(env_of(&config.upstreams[0]).keys().eq(["HOME", "MINE"]));
        assert!(env_of(&config.upstreams[1]).keys().eq(["EXTRA"]));
    }

    #[test]
    fn command_and_url_exactly_one_and_url_is_http() {
        let err = load("[mcp.servers.x]\ncommand = \"a\"\nurl = \"https://h/mcp\"\n", &[]).unwrap_err().to_string();
        assert!(err.contains("mcp.servers.x (line 1): sets both command and url"), "{err}");
        let err = load("[mcp.servers.x]\nargs = [\"a\"]\n", &[]).unwrap_err().to_string();
        assert!(err.contains("mcp.servers.x (line 1): sets neither command nor url"), "{err}");
        let err = load("[mcp.servers.x]\nurl = \"ws://h/mcp\"\nenv = { A = \"b\" }\n", &[]).unwrap_err().to_string();
        assert!(
            err.contains("mcp.servers.x.url (line 2): expected an http:// or https:// URL (ctx reaches upstream servers over Streamable HTTP), got a ws:// URL"),
            "{err}"
        );
        assert!(err.contains("mcp.servers.x.env (line 3): env applies to a command server only"), "{err}");
        let err = load("[mcp.servers.x]\ncommand = \"a\"\ntools = [\"a[\"]\n", &[]).unwrap_err().to_string();
        assert!(err.contains("mcp.servers.x.tools.0 (line 3): not a valid glob pattern"), "{err}");
    }

    #[test]
    fn names_and_keys_are_checked_by_the_schema() {
        let err = load(
            "[mcp.servers.\"-bad\"]\ncommand = \"a\"\n\n[mcp.servers.ok]\ncommand = \"a\"\ntimeout = 0\nretries = 3\n",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("mcp.servers.-bad (line 1): invalid name"), "{err}");
        assert!(err.contains("mcp.servers.ok.timeout (line 6): expected integer between 1 and 86400, got 0"), "{err}");
        assert!(err.contains("mcp.servers.ok.retries (line 7): unknown key"), "{err}");
        let err = load("[mcp.servers.x]\nurl = \"https://h\"\nheaders = { \"Bad Header\" = \"v\" }\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("mcp.servers.x.headers.\"Bad Header\" (line 3): invalid name"), "{err}");
        let err = load("[mcp]\nexpose = \"some\"\n", &[]).unwrap_err().to_string();
        assert!(err.contains("mcp.expose (line 2): expected one of [\"all\",\"discover\"]"), "{err}");
    }

    #[test]
    fn an_unset_variable_disables_only_its_server() {
        let text = "[mcp.servers.gh]\ncommand = \"gh-mcp\"\nenv = { GITHUB_TOKEN = \"${NOPE}\" }\n\n[mcp.servers.web]\nurl = \"${NOPE_URL}\"\n\n[mcp.servers.ok]\ncommand = \"ok\"\n";
        let config = load(text, &[]).unwrap();
        assert!(config.upstreams.iter().map(|u| u.name.as_str()).eq(["ok"]));
        let broken: Vec<String> = config.broken_upstreams().map(BrokenSection::section).collect();
        assert_eq!(broken, ["mcp.servers.gh", "mcp.servers.web"]);
        assert_eq!(config.broken_of(crate::config::ScriptKind::Tool).count(), 0);
        let gh = config.broken_upstreams().next().unwrap().message();
        assert!(
            gh.starts_with("ctx.toml: mcp.servers.gh.env.GITHUB_TOKEN (line 3): environment variable NOPE is not set"),
            "{gh}"
        );
        assert!(gh.contains("[mcp.servers.gh] is disabled"), "{gh}");
        // The url still holding `${NOPE_URL}` is not also called a bad URL.
        let web = &config.broken_upstreams().nth(1).unwrap().problems;
        assert_eq!(web.len(), 1, "{web:?}");
    }

    #[test]
    fn paths_expand_home_and_resolve_against_the_base() {
        let env = |name: &str| (name == "HOME").then(|| "/home/u".to_string());
        let base = Path::new("/w");
        assert_eq!(resolve_path("~/c.json", base, &env).unwrap(), PathBuf::from("/home/u/c.json"));
        assert_eq!(resolve_path("c.json", base, &env).unwrap(), PathBuf::from("/w/c.json"));
        assert_eq!(resolve_path("/abs/c.json", base, &env).unwrap(), PathBuf::from("/abs/c.json"));
        assert!(resolve_path("~/c.json", base, &|_| None).unwrap_err().contains("HOME is not set"));
    }

    #[test]
    fn url_credentials_are_secret_parameters_and_passwords() {
        let url = "https://bob:pa55@h/mcp?api_key=K1&format=json&access_token=T2#f";
        assert_eq!(url_credentials(url), ["K1", "T2", "pa55"]);
        assert_eq!(
            url_secrets(url),
            ["f", "api_key=K1&format=json&access_token=T2", "K1", "json", "T2", "K1", "T2", "pa55"]
        );
        let config = load("[mcp.servers.w]\nurl = \"https://h/mcp?apiKey=literal-query-secret\"\n", &[]).unwrap();
        assert_eq!(config.upstreams.len(), 1);
        let shown = crate::config::redact::current()
            .apply("failed for url (https://h/mcp?apiKey=literal-query-secret)")
            .into_owned();
        assert!(!shown.contains("literal-query-secret"), "{shown}");
    }

    #[test]
    fn server_names_and_urls() {
        assert!(is_server_name("github") && is_server_name("a.b-c_d") && is_server_name(&"x".repeat(32)));
        assert!(
            !is_server_name("") && !is_server_name("-a") && !is_server_name("a b") && !is_server_name(&"x".repeat(33))
        );
        assert!(check_url("http://127.0.0.1:3000/mcp").is_ok() && check_url("HTTPS://h").is_ok());
        assert!(check_url("https:///mcp").unwrap_err().contains("host"));
        // No scheme: nothing of the value is echoed (it may hold a credential).
        assert!(!check_url("user:secret@host").unwrap_err().contains("secret"));
    }
}
