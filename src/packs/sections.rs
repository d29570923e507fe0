//! The config sections a pack needs, written as TOML: one `[tools|connectors|agents.script.*]`
//! section per script, whose `path` is the pack's copy, whose `allow_hosts` and `allow_env` are
//! what the manifest asks for, and whose other keys are the pack's config keys.

use std::path::Path;

use super::manifest::Manifest;
use super::{normalize, PackError};
use crate::config::{Config, ScriptKind, Use};
use crate::types::PackConfigKeyDefault;

/// What [`render`] wrote and what it left out.
#[derive(Clone, Debug, Default)]
pub struct Rendered {
    /// The TOML text of the new sections (empty when every section exists).
    pub text: String,
    /// The sections in `text`, dotted (`tools.script.jira-search`).
    pub added: Vec<String>,
    /// Sections the config already has: left as they are.
    pub skipped: Vec<String>,
}

/// The host entry written when a pack asks for none: `.invalid` never resolves (RFC 2606), so
/// `http.*` reaches nothing, where an absent `allow_hosts` would allow every public host.
pub const NO_HOSTS: &str = "none.invalid";

/// The sections of `manifest` that `config_text` does not have yet (`only`: just these
/// sections, dotted, e.g. the new ones of an update).
pub fn render(manifest: &Manifest, config_text: &str, only: Option<&[String]>) -> Rendered {
    let existing: toml::Table = toml::from_str(config_text).unwrap_or_default();
    let has = |kind: ScriptKind, name: &str| {
        kind.section()
            .split('.')
            .try_fold(&existing, |t, k| t.get(k).and_then(toml::Value::as_table))
            .is_some_and(|t| t.contains_key(name))
    };
    let folder = super::Workspace::folder(manifest.name());
    let spec = &manifest.spec;
    let quote = |s: &str| toml::Value::String(s.to_string()).to_string();
    let list = |items: &[String]| format!("[{}]", items.iter().map(|i| quote(i)).collect::<Vec<_>>().join(", "));
    let mut out = Rendered::default();
    for (kind, script) in manifest.scripts() {
        let dotted = format!("{}.{}", kind.section(), script.name.as_str());
        if only.is_some_and(|only| !only.contains(&dotted)) {
            continue;
        }
        if has(kind, script.name.as_str()) {
            out.skipped.push(dotted);
            continue;
        }
        let mut text = String::new();
        let about = script.description.as_ref().map(|d| format!(": {}", one_line(d))).unwrap_or_default();
        text.push_str(&format!("# From pack {} {} ({folder}){about}\n", manifest.name(), manifest.version()));
        text.push_str(&format!("[{dotted}]\n"));
        text.push_str(&format!("path = {}\n", quote(&format!("{folder}/{}", script.path.as_str()))));
        if let Some(timeout) = script.timeout {
            text.push_str(&format!("timeout = {timeout}\n"));
        }
        let hosts: Vec<String> = spec.hosts.iter().map(|h| h.to_string()).collect();
        if hosts.is_empty() {
            text.push_str(&format!(
                "allow_hosts = {}  # the pack asks for no network access\n",
                list(&[NO_HOSTS.into()])
            ));
        } else {
            text.push_str(&format!(
                "allow_hosts = {}  # what the pack asks for; http.* reaches no other host\n",
                list(&hosts)
            ));
        }
        if !spec.env.is_empty() {
            let vars: Vec<String> = spec.env.iter().map(|v| v.to_string()).collect();
            text.push_str(&format!("allow_env = {}  # the variables its scripts read with env.get\n", list(&vars)));
        }
        for (key, about) in &spec.config {
            if !script.config.is_empty() && !script.config.iter().any(|k| k == key.as_str()) {
                continue;
            }
            let required = if about.required { " (required)" } else { "" };
            let mut comment = format!("# {}{required}", one_line(&about.description));
            let value = match (&about.env, &about.default) {
                (Some(var), _) => {
                    comment.push_str(&format!("; set {} in the environment ctx runs in", var.as_str()));
                    quote(&format!("${{{}}}", var.as_str()))
                }
                (None, Some(PackConfigKeyDefault::String(s))) => quote(s),
                (None, Some(PackConfigKeyDefault::Integer(i))) => i.to_string(),
                (None, Some(PackConfigKeyDefault::Boolean(b))) => b.to_string(),
                (None, None) => {
                    match &about.example {
                        Some(example) => comment.push_str(&format!("; fill in, e.g. {}", one_line(example))),
                        None => comment.push_str("; fill in"),
                    }
                    quote("")
                }
            };
            text.push_str(&format!("{comment}\n{} = {value}\n", key.as_str()));
        }
        if !out.text.is_empty() {
            out.text.push('\n');
        }
        out.text.push_str(&text);
        out.added.push(dotted);
    }
    out
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Appends `text` to the config file, after checking that the result still loads; the file is
/// replaced whole (a temporary file renamed over it).
pub fn append(config_file: &Path, text: &str) -> Result<(), PackError> {
    let current = std::fs::read_to_string(config_file)
        .map_err(PackError::io(format!("cannot read {}", config_file.display())))?;
    let mut next = current.clone();
    if !next.is_empty() && !next.ends_with('\n') {
        next.push('\n');
    }
    if !next.is_empty() {
        next.push('\n');
    }
    next.push_str(text);
    if let Err(e) = Config::from_text_for(&next, config_file, config_file, &|name| std::env::var(name).ok(), Use::Local)
    {
        return Err(PackError::Source {
            given: config_file.display().to_string(),
            message: format!("the sections would make the config invalid, so it was left as it is: {e}"),
        });
    }
    let tmp = config_file.with_extension(format!("toml.{}.tmp", std::process::id()));
    std::fs::write(&tmp, next).map_err(PackError::io(format!("cannot write {}", tmp.display())))?;
    std::fs::rename(&tmp, config_file).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        PackError::io(format!("cannot write {}", config_file.display()))(e)
    })
}

/// The script sections of the config text whose `path` lies in `folder` (relative to
/// `base_dir`), dotted.
pub fn sections_naming(config_text: &str, base_dir: &Path, folder: &str) -> Vec<String> {
    let existing: toml::Table = toml::from_str(config_text).unwrap_or_default();
    let inside = normalize(&base_dir.join(folder));
    let mut out = Vec::new();
    for kind in [ScriptKind::Tool, ScriptKind::Connector, ScriptKind::Agent] {
        let table = kind.section().split('.').try_fold(&existing, |t, k| t.get(k).and_then(toml::Value::as_table));
        for (name, section) in table.into_iter().flatten() {
            let path = section.get("path").and_then(toml::Value::as_str).unwrap_or_default();
            if !path.is_empty() && normalize(&base_dir.join(path)).starts_with(&inside) {
                out.push(format!("{}.{name}", kind.section()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_carry_the_pack_permissions_and_skip_existing_ones() {
        let manifest = Manifest::parse(
            r#"
name = "jira"
version = "1.0.0"
description = "Jira."
hosts = ["*.atlassian.net"]

[[tools]]
name = "jira-search"
path = "tools/search.lua"
timeout = 20

[[agents]]
name = "jira-triage"
path = "agents/triage.lua"

[config.url]
description = "Site URL"
required = true
example = "https://x.atlassian.net"

[config.api_token]
description = "API token"
env = "JIRA_API_TOKEN"
"#,
        )
        .unwrap();
        let out = render(&manifest, "[agents.script.jira-triage]\npath = \"mine.lua\"\n", None);
        assert_eq!(out.added, ["tools.script.jira-search"]);
        assert_eq!(out.skipped, ["agents.script.jira-triage"]);
        assert!(out.text.contains("path = \"packs/jira/tools/search.lua\"\ntimeout = 20\n"), "{}", out.text);
        assert!(out.text.contains("allow_hosts = [\"*.atlassian.net\"]"), "{}", out.text);
        assert!(out.text.contains("api_token = \"${JIRA_API_TOKEN}\""), "{}", out.text);
        assert!(out.text.contains("url = \"\""), "{}", out.text);
        let config = Config::from_text(&out.text, Path::new("ctx.toml"), Path::new("/w/ctx.toml"), &|v| {
            (v != crate::db::URL_ENV).then(|| "t".into())
        })
        .unwrap();
        assert_eq!(config.scripts[0].allow_hosts.as_deref(), Some(&["*.atlassian.net".to_string()][..]));
        assert_eq!(sections_naming(&out.text, Path::new("/w"), "packs/jira"), ["tools.script.jira-search"]);
    }
}
