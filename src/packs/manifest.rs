//! `pack.toml`: read without following links, validated against `pack-manifest.schema.json`,
//! then checked for what a schema cannot say (paths that leave the pack, keys ctx reserves).

use std::collections::BTreeSet;
use std::path::Path;

use super::files::{check_relative, Entry};
use super::PackError;
use crate::config::{hosts::HostRule, reserved_script_keys, ScriptKind};
use crate::schema::{Dialect, SchemaValidator};
use crate::types;

/// The manifest's file name, at the root of a pack.
pub const MANIFEST: &str = "pack.toml";

/// The most bytes a manifest may have.
const MANIFEST_BYTES: u64 = 64 * 1024;

/// A validated manifest.
#[derive(Clone, Debug)]
pub struct Manifest {
    pub spec: types::PackManifest,
}

/// What a pack asks for: shown at install, compared at update.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Asks {
    pub hosts: Vec<String>,
    /// Every variable: the ones config values take (`${VAR}`) and the ones `env.get` reads.
    pub env: Vec<String>,
    pub config_keys: Vec<String>,
}

impl Manifest {
    /// Reads and validates `<dir>/pack.toml`.
    pub fn read(dir: &Path) -> Result<Manifest, PackError> {
        let path = dir.join(MANIFEST);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(PackError::Manifest {
                    file: MANIFEST.into(),
                    problems: vec![format!(
                        "there is no {MANIFEST} in {}: a pack is a folder with a {MANIFEST} manifest at its root",
                        dir.display()
                    )],
                })
            }
            Err(e) => return Err(PackError::io(format!("cannot read {}", path.display()))(e)),
        };
        if meta.file_type().is_symlink() || !meta.is_file() {
            return Err(PackError::Unsafe { path: MANIFEST.into(), why: "is not a regular file".into() });
        }
        if meta.len() > MANIFEST_BYTES {
            return Err(PackError::Unsafe {
                path: MANIFEST.into(),
                why: format!("is {} bytes; a manifest may have at most {MANIFEST_BYTES}", meta.len()),
            });
        }
        let text = std::fs::read_to_string(&path).map_err(PackError::io(format!("cannot read {}", path.display())))?;
        Manifest::parse(&text)
    }

    /// Validates manifest text.
    pub fn parse(text: &str) -> Result<Manifest, PackError> {
        let fail = |problems: Vec<String>| PackError::Manifest { file: MANIFEST.into(), problems };
        let table: toml::Table =
            toml::from_str(text).map_err(|e| fail(vec![format!("not valid TOML: {}", e.message().trim())]))?;
        let value = serde_json::to_value(table).map_err(|e| fail(vec![e.to_string()]))?;
        let problems: Vec<String> = SchemaValidator::for_definition("PackManifest")
            .problems(&value, Dialect::Toml)
            .into_iter()
            .map(|p| format!("{}: {}", p.dotted(), p.message))
            .collect();
        if !problems.is_empty() {
            return Err(fail(problems));
        }
        let spec: types::PackManifest = serde_json::from_value(value).map_err(|e| fail(vec![e.to_string()]))?;
        let manifest = Manifest { spec };
        let problems = manifest.problems(reserved_script_keys());
        if !problems.is_empty() {
            return Err(fail(problems));
        }
        Ok(manifest)
    }

    pub fn name(&self) -> &str {
        self.spec.name.as_str()
    }

    pub fn version(&self) -> &str {
        self.spec.version.as_str()
    }

    /// The scripts of each kind, in the order the sections are written.
    pub fn scripts(&self) -> impl Iterator<Item = (ScriptKind, &types::PackScript)> {
        self.spec
            .tools
            .iter()
            .map(|s| (ScriptKind::Tool, s))
            .chain(self.spec.connectors.iter().map(|s| (ScriptKind::Connector, s)))
            .chain(self.spec.agents.iter().map(|s| (ScriptKind::Agent, s)))
    }

    /// The section names of one kind.
    pub fn names_of(&self, kind: ScriptKind) -> Vec<String> {
        self.scripts().filter(|(k, _)| *k == kind).map(|(_, s)| s.name.to_string()).collect()
    }

    /// The hosts, variables and config keys the pack asks for.
    pub fn asks(&self) -> Asks {
        let mut env: BTreeSet<String> = self.spec.env.iter().map(|v| v.to_string()).collect();
        env.extend(self.spec.config.values().filter_map(|k| k.env.as_ref()).map(|v| v.to_string()));
        Asks {
            hosts: self.spec.hosts.iter().map(|h| h.to_string()).collect(),
            env: env.into_iter().collect(),
            config_keys: self.spec.config.keys().map(|k| k.to_string()).collect(),
        }
    }

    /// What the schema cannot check: script paths inside the pack, unique section names,
    /// config keys that are not ctx's own section settings, host entries that parse.
    fn problems(&self, reserved: &[String]) -> Vec<String> {
        let mut problems = Vec::new();
        let mut seen: BTreeSet<(ScriptKind, String)> = BTreeSet::new();
        for (list, kind, scripts) in [
            ("tools", ScriptKind::Tool, &self.spec.tools),
            ("connectors", ScriptKind::Connector, &self.spec.connectors),
            ("agents", ScriptKind::Agent, &self.spec.agents),
        ] {
            for (i, script) in scripts.iter().enumerate() {
                let path = script.path.as_str();
                if let Err(why) = check_relative(path) {
                    problems.push(format!("{list}.{i}.path: {path:?} {why}"));
                } else if !path.ends_with(".lua") {
                    problems.push(format!("{list}.{i}.path: {path:?} is not a .lua file"));
                }
                for (j, key) in script.config.iter().enumerate() {
                    if !self.spec.config.keys().any(|k| k.as_str() == key) {
                        problems.push(format!("{list}.{i}.config.{j}: {key:?} is not a key of [config]"));
                    }
                }
                if !seen.insert((kind, script.name.to_string())) {
                    problems.push(format!("{list}.{i}.name: {:?} is used twice", script.name.as_str()));
                }
            }
        }
        for key in self.spec.config.keys() {
            if reserved.iter().any(|r| r == key.as_str()) {
                problems.push(format!(
                    "config.{}: is a setting of ctx's own script sections ({}); name the key differently",
                    key.as_str(),
                    reserved.join(", ")
                ));
            }
        }
        for (key, about) in &self.spec.config {
            // ctx.toml expands ${VAR} in every value: a default would read any variable of the
            // server's environment (its own token too), while the install said "variables: none".
            if let Some(crate::types::PackConfigKeyDefault::String(text)) = &about.default {
                if text.contains("${") {
                    problems.push(format!(
                        "config.{}.default: has \"${{\", which ctx.toml would expand from the environment; a key that reads a variable says so with `env`",
                        key.as_str()
                    ));
                }
            }
        }
        for (i, host) in self.spec.hosts.iter().enumerate() {
            match HostRule::parse(host) {
                Err(why) => problems.push(format!("hosts.{i}: {why}")),
                // An address, a range or a local name reaches inside the network ctx runs in:
                // that is the operator's to grant, in the section, not a pack's to ask for.
                Ok(HostRule::Addr(_) | HostRule::Net { .. }) => problems.push(format!(
                    "hosts.{i}: {host:?} is an IP address or range; a pack asks for public host names only (an operator adds private hosts to the section's allow_hosts)"
                )),
                Ok(HostRule::Name(name) | HostRule::Suffix(name)) if is_local_name(&name) => problems.push(format!(
                    "hosts.{i}: {host:?} is a local name; a pack asks for public host names only (an operator adds private hosts to the section's allow_hosts)"
                )),
                Ok(_) => {}
            }
        }
        problems
    }

    /// Script paths that name no file of the pack (checked once the files are walked).
    pub fn missing_scripts(&self, files: &[Entry]) -> Vec<String> {
        let mut problems = Vec::new();
        for (list, scripts) in
            [("tools", &self.spec.tools), ("connectors", &self.spec.connectors), ("agents", &self.spec.agents)]
        {
            for (i, script) in scripts.iter().enumerate() {
                if !files.iter().any(|f| f.rel == script.path.as_str()) {
                    problems.push(format!("{list}.{i}.path: {:?} is not a file of the pack", script.path.as_str()));
                }
            }
        }
        problems
    }
}

/// Names that resolve inside the network ctx runs in, whatever DNS says.
fn is_local_name(name: &str) -> bool {
    let name = name.trim_end_matches('.');
    ["localhost", "local", "internal", "home.arpa", "localdomain", "lan"]
        .iter()
        .any(|local| name == *local || name.ends_with(&format!(".{local}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
name = "jira"
version = "1.0.0"
description = "Jira."
hosts = ["*.atlassian.net"]
env = ["JIRA_DEBUG"]

[[tools]]
name = "jira-search"
path = "tools/search.lua"

[config.api_token]
description = "token"
env = "JIRA_API_TOKEN"
"#;

    #[test]
    fn a_good_manifest_asks_for_its_hosts_and_variables() {
        let m = Manifest::parse(OK).unwrap();
        assert_eq!(m.name(), "jira");
        let asks = m.asks();
        assert_eq!(asks.hosts, ["*.atlassian.net"]);
        assert_eq!(asks.env, ["JIRA_API_TOKEN", "JIRA_DEBUG"]);
        assert_eq!(asks.config_keys, ["api_token"]);
    }

    #[test]
    fn bad_manifests_name_the_field() {
        let err = |text: &str| Manifest::parse(text).unwrap_err().to_string();
        let dotdot = err(&OK.replace("tools/search.lua", "../../etc/x.lua"));
        assert!(dotdot.contains("tools.0.path") && dotdot.contains("'..'"), "{dotdot}");
        let abs = err(&OK.replace("tools/search.lua", "/etc/x.lua"));
        assert!(abs.contains("tools.0.path") && abs.contains("absolute"), "{abs}");
        let reserved = err(&OK.replace("[config.api_token]", "[config.timeout]"));
        assert!(reserved.contains("config.timeout"), "{reserved}");
        let name = err(&OK.replace("name = \"jira\"", "name = \"../jira\""));
        assert!(name.contains("name"), "{name}");
        let unknown = err(&format!("{OK}\nextra = 1\n"));
        assert!(unknown.contains("extra"), "{unknown}");
    }

    #[test]
    fn a_manifest_cannot_widen_the_sandbox_behind_the_install_summary() {
        let err = |text: &str| Manifest::parse(text).unwrap_err().to_string();
        // A default that ctx.toml would expand reads a variable the summary does not show.
        let expanded = err(&format!("{OK}\n[config.units]\ndescription = \"u\"\ndefault = \"${{CTX_TOKEN}}\"\n"));
        assert!(expanded.contains("config.units.default") && expanded.contains("env"), "{expanded}");
        for host in [
            "169.254.169.254",
            "10.0.0.0/8",
            "0.0.0.0/0",
            "::1",
            "localhost",
            "db.internal",
            "*.local",
            "nas.home.arpa",
        ] {
            let text = OK.replace("\"*.atlassian.net\"", &format!("\"*.atlassian.net\", {host:?}"));
            let refused = err(&text);
            assert!(refused.contains("hosts.1") && refused.contains("public host names only"), "{host}: {refused}");
        }
        assert!(Manifest::parse(&OK.replace("\"*.atlassian.net\"", "\"api.github.com\", \"*.statuspage.io\"")).is_ok());
    }
}
