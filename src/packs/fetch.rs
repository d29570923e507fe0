//! Where a pack comes from (a folder, a git repository, a registry entry), and the staging of
//! its copy: fetched and copied into a temporary folder inside the workspace, verified, and only
//! then renamed into `packs/<name>/`. A refused pack leaves nothing behind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::files::{self, CAPS};
use super::lock::{self, Lock};
use super::manifest::Manifest;
use super::{git, registry, PackError, PACKS_DIR};
use crate::config::Config;
use crate::types::{PackLockEntry, PackLockEntryKind};

/// The workspace packs are installed into: the config's folder and its registry.
#[derive(Clone, Debug)]
pub struct Workspace {
    /// The folder of `ctx.toml`: `packs/` and `ctx.lock` are here.
    pub base_dir: PathBuf,
    /// `[packs] registry`, as written (`${VAR}` expanded).
    pub registry: Option<String>,
}

impl Workspace {
    pub fn of(config: &Config) -> Workspace {
        Workspace {
            base_dir: config.base_dir.clone(),
            registry: config.spec.packs.registry.as_ref().map(|r| r.to_string()),
        }
    }

    /// `packs/<name>`, relative to the config's folder, as the lock and the sections name it.
    pub fn folder(name: &str) -> String {
        format!("{PACKS_DIR}/{name}")
    }

    /// A new temporary folder in the workspace, removed when the guard drops.
    pub fn temp(&self) -> Result<Temp, PackError> {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        for attempt in 0..16u32 {
            let dir = self.base_dir.join(format!(".ctx-pack-{}-{nanos}-{attempt}", std::process::id()));
            match std::fs::create_dir(&dir) {
                Ok(()) => return Ok(Temp(dir)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(PackError::io(format!(
                        "cannot create a temporary folder in {}",
                        self.base_dir.display()
                    ))(e))
                }
            }
        }
        Err(PackError::Io {
            what: "cannot create a temporary folder".into(),
            source: std::io::Error::other("every name was taken"),
        })
    }
}

/// A temporary folder, removed with everything in it when dropped.
#[derive(Debug)]
pub struct Temp(PathBuf);

impl Temp {
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A SOURCE of `ctx tool install SOURCE[@REF]`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A folder, copied as it is.
    Path { dir: PathBuf },
    /// A git repository (a URL, or a local repository given with @REF), and the pack's folder
    /// inside it (`URL//sub/dir`).
    Git { url: String, subdir: Option<String>, reference: Option<String> },
    /// A pack of the configured registry: its name, or its folder in the registry.
    Registry { entry: String, reference: Option<String> },
}

impl Source {
    /// Reads SOURCE[@REF]; relative paths are relative to `cwd`.
    pub fn parse(text: &str, cwd: &Path) -> Result<Source, PackError> {
        let fail = |message: &str| PackError::Source { given: text.into(), message: message.into() };
        let (body, reference) = split_ref(text);
        if body.is_empty() {
            return Err(fail("it is empty; give a folder, a git URL or a registry pack's name"));
        }
        if is_url(body) {
            let (url, subdir) = split_subdir(body);
            return Ok(Source::Git { url: url.into(), subdir, reference });
        }
        let local = cwd.join(body);
        let looks_local = body.starts_with('.') || body.starts_with('/') || body.starts_with('~');
        if local.is_dir() {
            let dir = std::path::absolute(&local).map(|p| super::normalize(&p)).unwrap_or(local);
            return Ok(match reference {
                Some(reference) => {
                    Source::Git { url: dir.display().to_string(), subdir: None, reference: Some(reference) }
                }
                None => Source::Path { dir },
            });
        }
        if looks_local || body.contains('\\') {
            return Err(fail(&format!("folder {} does not exist", local.display())));
        }
        files::check_relative(body).map_err(|why| fail(&format!("as a registry pack, {body:?} {why}")))?;
        Ok(Source::Registry { entry: body.into(), reference })
    }

    /// Where `update` fetches an installed pack from again: the same place, at `reference` when
    /// given, else at the ref it was installed from.
    pub fn of_entry(entry: &PackLockEntry, reference: Option<String>) -> Source {
        let url = entry.url.clone().unwrap_or_else(|| entry.source.clone());
        match entry.kind {
            PackLockEntryKind::Path => Source::Path { dir: PathBuf::from(url) },
            PackLockEntryKind::Git => {
                Source::Git { url, subdir: entry.subdir.clone(), reference: reference.or_else(|| entry.ref_.clone()) }
            }
        }
    }
}

/// `body@ref`: the last '@' that has no '/' or ':' after it (so `git@host:o/r` keeps its '@').
fn split_ref(text: &str) -> (&str, Option<String>) {
    match text.rfind('@') {
        Some(at) if at > 0 && !text[at + 1..].contains(['/', ':']) && !text[at + 1..].is_empty() => {
            (&text[..at], Some(text[at + 1..].to_string()))
        }
        _ => (text, None),
    }
}

fn is_url(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    ["http://", "https://", "ssh://", "git://", "file://"].iter().any(|p| lower.starts_with(p))
        || (text.starts_with("git@") && text.contains(':'))
}

/// `URL//sub/dir`: the repository and the pack's folder inside it.
fn split_subdir(url: &str) -> (&str, Option<String>) {
    let after_scheme = url.find("://").map(|i| i + 3).unwrap_or(0);
    // file:///abs/path: the third '/' starts the path.
    let start = after_scheme + usize::from(url[after_scheme..].starts_with('/'));
    match url[start..].find("//") {
        Some(i) => {
            let sub = url[start + i + 2..].trim_end_matches('/');
            (&url[..start + i], (!sub.is_empty()).then(|| sub.to_string()))
        }
        None => (url, None),
    }
}

/// Where a staged pack came from, as the lock records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// SOURCE as given, without @REF.
    pub source: String,
    pub git: bool,
    /// The repository, or the folder copied (absolute).
    pub url: String,
    pub subdir: Option<String>,
    pub reference: Option<String>,
    pub commit: Option<String>,
}

/// A pack fetched, copied into the workspace's temporary folder and verified: ready to be moved
/// into `packs/<name>/`.
#[derive(Debug)]
pub struct Staged {
    temp: Temp,
    pub manifest: Manifest,
    /// SHA-256 of every file, by relative name.
    pub files: BTreeMap<String, String>,
    pub origin: Origin,
}

/// Fetches and stages the pack `source` names (`shown` is SOURCE as given, for the lock).
pub fn fetch(ws: &Workspace, shown: &str, source: Source) -> Result<Staged, PackError> {
    let temp = ws.temp()?;
    let (from, origin) = match source {
        Source::Path { dir } => {
            let origin = Origin {
                source: split_ref(shown).0.to_string(),
                git: false,
                url: dir.display().to_string(),
                subdir: None,
                reference: None,
                commit: None,
            };
            (dir, origin)
        }
        Source::Git { url, subdir, reference } => {
            let clone = temp.path().join("clone");
            let commit = git::clone(&url, reference.as_deref(), &clone)?;
            let from = inside(&clone, subdir.as_deref(), shown)?;
            let origin = Origin {
                source: split_ref(shown).0.to_string(),
                git: true,
                url,
                subdir,
                reference,
                commit: Some(commit),
            };
            (from, origin)
        }
        Source::Registry { entry, reference } => {
            let index = registry::open(ws, temp.path(), reference.as_deref())?;
            let path = index.resolve(&entry)?;
            let from = inside(&index.root, Some(&path), shown)?;
            let origin = Origin {
                source: split_ref(shown).0.to_string(),
                git: index.commit.is_some(),
                url: index.url.clone(),
                subdir: Some(path).filter(|_| index.commit.is_some()),
                reference: index.reference.clone(),
                commit: index.commit.clone(),
            };
            // A registry read in place is a folder: the pack's own folder is what update copies.
            let origin = if origin.git { origin } else { Origin { url: from.display().to_string(), ..origin } };
            (from, origin)
        }
    };
    if std::fs::symlink_metadata(from.join(super::MANIFEST)).is_err() {
        return Err(PackError::Source {
            given: shown.into(),
            message: format!(
                "it has no {} at its root: a pack is a folder with that manifest (for a pack inside a git \
                 repository, add //sub/dir to the URL)",
                super::MANIFEST
            ),
        });
    }
    let manifest = Manifest::read(&from)?;
    let entries = files::walk(&from, &CAPS)?;
    let missing = manifest.missing_scripts(&entries);
    if !missing.is_empty() {
        return Err(PackError::Manifest { file: super::MANIFEST.into(), problems: missing });
    }
    let files = files::copy(&from, &temp.path().join("pack"), &CAPS)?;
    // The clone is not needed any more; the folder goes when the guard drops anyway.
    let _ = std::fs::remove_dir_all(temp.path().join("clone"));
    Ok(Staged { temp, manifest, files, origin })
}

/// `sub` inside `root`, which it may not leave (through `..` or a linked folder).
fn inside(root: &Path, sub: Option<&str>, shown: &str) -> Result<PathBuf, PackError> {
    let Some(sub) = sub else { return Ok(root.to_path_buf()) };
    files::check_relative(sub)
        .map_err(|why| PackError::Source { given: shown.into(), message: format!("{sub:?} {why}") })?;
    let dir = root.join(sub);
    let (Ok(real_root), Ok(real)) = (std::fs::canonicalize(root), std::fs::canonicalize(&dir)) else {
        return Err(PackError::Source { given: shown.into(), message: format!("there is no folder {sub:?} in it") });
    };
    if !real.starts_with(&real_root) || !real.is_dir() {
        return Err(PackError::Unsafe {
            path: sub.into(),
            why: "leaves the repository (a link) or is not a folder".into(),
        });
    }
    Ok(real)
}

impl Staged {
    /// The staged copy of the pack.
    pub fn dir(&self) -> PathBuf {
        self.temp.path().join("pack")
    }

    /// Moves the staged pack into `packs/<name>/` (replacing the installed one when `replace`)
    /// and records it in the lock. Returns the entry.
    pub fn place(self, ws: &Workspace, lock: &mut Lock, replace: bool) -> Result<PackLockEntry, PackError> {
        let name = self.manifest.name().to_string();
        let rel = Workspace::folder(&name);
        let target = ws.base_dir.join(&rel);
        let exists = std::fs::symlink_metadata(&target).is_ok();
        if !replace && (exists || lock.get(&name).is_some()) {
            return Err(PackError::Exists { name, folder: rel });
        }
        let entry = self.entry()?;
        let packs = ws.base_dir.join(PACKS_DIR);
        if std::fs::symlink_metadata(&packs).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(PackError::Unsafe {
                path: PACKS_DIR.into(),
                why: "is a symbolic link; make it a folder".into(),
            });
        }
        std::fs::create_dir_all(&packs).map_err(PackError::io(format!("cannot create {}", packs.display())))?;
        if exists {
            // The old copy goes into the temporary folder, which takes it away when dropped.
            std::fs::rename(&target, self.temp.path().join("old"))
                .map_err(PackError::io(format!("cannot move the installed {rel} aside")))?;
        }
        std::fs::rename(self.dir(), &target).map_err(PackError::io(format!("cannot move the pack into {rel}")))?;
        lock.upsert(entry.clone());
        lock.write(&ws.base_dir)?;
        Ok(entry)
    }

    /// The lock entry this staged pack would get.
    pub fn entry(&self) -> Result<PackLockEntry, PackError> {
        let m = &self.manifest;
        let asks = m.asks();
        let o = &self.origin;
        lock::entry(json!({
            "name": m.name(),
            "version": m.version(),
            "source": o.source,
            "kind": if o.git { "git" } else { "path" },
            "url": o.url,
            "subdir": o.subdir,
            "ref": o.reference,
            "commit": o.commit,
            "folder": Workspace::folder(m.name()),
            "hosts": asks.hosts,
            "env": asks.env,
            "config_keys": asks.config_keys,
            "tools": m.names_of(crate::config::ScriptKind::Tool),
            "connectors": m.names_of(crate::config::ScriptKind::Connector),
            "agents": m.names_of(crate::config::ScriptKind::Agent),
            "files": self.files,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("mine")).unwrap();
        let cwd = dir.path();
        assert_eq!(Source::parse("./mine", cwd).unwrap(), Source::Path { dir: cwd.join("mine") });
        assert_eq!(
            Source::parse("mine@v1", cwd).unwrap(),
            Source::Git { url: cwd.join("mine").display().to_string(), subdir: None, reference: Some("v1".into()) }
        );
        assert_eq!(
            Source::parse("https://example.com/r.git//packs/jira@v2", cwd).unwrap(),
            Source::Git {
                url: "https://example.com/r.git".into(),
                subdir: Some("packs/jira".into()),
                reference: Some("v2".into())
            }
        );
        assert_eq!(
            Source::parse("git@github.com:o/r.git", cwd).unwrap(),
            Source::Git { url: "git@github.com:o/r.git".into(), subdir: None, reference: None }
        );
        assert_eq!(
            Source::parse("file:///srv/r//p", cwd).unwrap(),
            Source::Git { url: "file:///srv/r".into(), subdir: Some("p".into()), reference: None }
        );
        assert_eq!(Source::parse("jira", cwd).unwrap(), Source::Registry { entry: "jira".into(), reference: None });
        assert!(Source::parse("./nope", cwd).is_err());
        assert!(Source::parse("a/../../b", cwd).is_err());
    }
}
