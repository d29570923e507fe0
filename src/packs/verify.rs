//! The load-time check: every locked pack that a config section uses is hashed and compared
//! with `ctx.lock`; the sections of a pack that does not match are refused, each on its own,
//! the way a section with an unset variable is ([`crate::config::BrokenSection`]).

use std::path::{Path, PathBuf};

use super::files::{self, CAPS};
use super::lock::Lock;
use super::{normalize, LOCK_FILE, PACKS_DIR};
use crate::config::{BrokenSection, Config, ConfigProblem, ScriptKind, SectionKind};
use crate::types::PackLockEntry;

/// How an installed pack differs from its lock entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mismatch {
    pub changed: Vec<String>,
    pub missing: Vec<String>,
    pub extra: Vec<String>,
    /// The folder could not be read as a pack (a link in it, a file over the caps, ...).
    pub unreadable: Option<String>,
}

impl Mismatch {
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.missing.is_empty() && self.extra.is_empty() && self.unreadable.is_none()
    }

    /// How many files differ.
    pub fn count(&self) -> usize {
        self.changed.len() + self.missing.len() + self.extra.len()
    }
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(why) = &self.unreadable {
            parts.push(why.clone());
        }
        let list = |files: &[String]| files.join(", ");
        if !self.changed.is_empty() {
            parts.push(format!("{} changed since install", list(&self.changed)));
        }
        if !self.missing.is_empty() {
            parts.push(format!("{} missing", list(&self.missing)));
        }
        if !self.extra.is_empty() {
            parts.push(format!("{} added (not in {LOCK_FILE})", list(&self.extra)));
        }
        write!(f, "{}", parts.join("; "))
    }
}

/// Compares the installed files of `entry` with the lock.
pub fn check(base_dir: &Path, entry: &PackLockEntry) -> Mismatch {
    let folder = base_dir.join(entry.folder.as_str());
    if std::fs::symlink_metadata(&folder).is_ok_and(|m| m.file_type().is_symlink()) {
        return Mismatch {
            unreadable: Some(format!("{} is a symbolic link", entry.folder.as_str())),
            ..Default::default()
        };
    }
    if !folder.is_dir() {
        return Mismatch { missing: entry.files.keys().cloned().collect(), ..Default::default() };
    }
    let found = match files::hash(&folder, &CAPS) {
        Ok(found) => found,
        Err(e) => return Mismatch { unreadable: Some(e.to_string()), ..Default::default() },
    };
    let mut mismatch = Mismatch::default();
    for (file, want) in &entry.files {
        match found.get(file) {
            None => mismatch.missing.push(file.clone()),
            Some(got) if got != want.as_str() => mismatch.changed.push(file.clone()),
            Some(_) => {}
        }
    }
    mismatch.extra = found.keys().filter(|f| !entry.files.contains_key(*f)).cloned().collect();
    mismatch
}

/// Refuses the script sections of every pack that does not match `ctx.lock`: they leave
/// `config.scripts` (and the typed sections) for `config.broken`, with a message that names the
/// files and what to run. Packs no section uses are not read. Returns the packs refused.
pub fn enforce(config: &mut Config) -> Vec<String> {
    let base = normalize(&config.base_dir);
    // Only when a section points into packs/: a workspace without packs reads nothing.
    let packs = base.join(PACKS_DIR);
    if !config.scripts.iter().any(|s| normalize(&s.path).starts_with(&packs)) {
        return Vec::new();
    }
    let lock = match Lock::read(&config.base_dir) {
        Ok(Some(lock)) => lock,
        Ok(None) => {
            refuse(
                config,
                &packs,
                &format!(
                    "{PACKS_DIR}/ holds packs installed with `ctx tool install`, pinned in {LOCK_FILE}, which is missing: \
                     restore {LOCK_FILE}, or install the pack again (move a folder of your own out of {PACKS_DIR}/)"
                ),
            );
            return vec![LOCK_FILE.to_string()];
        }
        Err(e) => {
            refuse(config, &packs, &format!("{e}"));
            return vec![LOCK_FILE.to_string()];
        }
    };
    let mut refused = Vec::new();
    for entry in &lock.packs {
        let folder = base.join(entry.folder.as_str());
        if !config.scripts.iter().any(|s| normalize(&s.path).starts_with(&folder)) {
            continue;
        }
        let mismatch = check(&config.base_dir, entry);
        if mismatch.is_empty() {
            continue;
        }
        let name = entry.name.as_str();
        let message = format!(
            "pack '{name}' ({}) does not match {LOCK_FILE}: {mismatch}; its sections are refused. Run `ctx tool update \
             {name} --yes` to restore the pinned files, or `ctx tool remove {name}` and install it again",
            entry.folder.as_str()
        );
        refuse(config, &folder, &message);
        refused.push(name.to_string());
    }
    // A folder under packs/ that the lock does not name was not installed (or was renamed):
    // nothing pins its files.
    let pinned: Vec<PathBuf> = lock.packs.iter().map(|e| base.join(e.folder.as_str())).collect();
    let unpinned: std::collections::BTreeSet<PathBuf> = config
        .scripts
        .iter()
        .map(|s| normalize(&s.path))
        .filter(|p| p.starts_with(&packs) && !pinned.iter().any(|f| p.starts_with(f)))
        .filter_map(|p| p.strip_prefix(&packs).ok().and_then(|r| r.components().next()).map(|c| packs.join(c)))
        .collect();
    for folder in unpinned {
        let shown = folder.strip_prefix(&base).unwrap_or(&folder).display().to_string();
        let message = format!(
            "{shown} is not a pack {LOCK_FILE} pins (it was not installed with `ctx tool install`, or was renamed): \
             install it with `ctx tool install`, or move a folder of your own out of {PACKS_DIR}/"
        );
        refuse(config, &folder, &message);
        refused.push(shown);
    }
    refused
}

/// Moves every usable script section whose script lies under `folder` to `config.broken`.
fn refuse(config: &mut Config, folder: &Path, message: &str) {
    let file = config.file.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let (inside, kept): (Vec<_>, Vec<_>) =
        std::mem::take(&mut config.scripts).into_iter().partition(|s| normalize(&s.path).starts_with(folder));
    config.scripts = kept;
    for section in inside {
        let table = section.kind.section().to_string();
        let typed = match section.kind {
            ScriptKind::Tool => Some(&mut config.spec.tools.script),
            ScriptKind::Connector => Some(&mut config.spec.connectors.script),
            ScriptKind::Agent => Some(&mut config.spec.agents.script),
            ScriptKind::Code => None,
        };
        if let Some(typed) = typed {
            typed.retain(|name, _| name.as_str() != section.name);
        }
        config.broken.push(BrokenSection {
            refused: true,
            kind: SectionKind::Script(section.kind),
            problems: vec![ConfigProblem {
                key: format!("{table}.{}.path", section.name),
                line: None,
                message: message.to_string(),
            }],
            table,
            name: section.name,
            path: Some(PathBuf::from(&section.path)),
            file: file.clone(),
        });
    }
}
