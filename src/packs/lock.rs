//! `ctx.lock`: the installed packs, pinned (`pack-lock.schema.json`). TOML, like `ctx.toml`
//! and `Cargo.lock`: one format for the files a person keeps next to each other and reviews in a
//! diff, with a comment at the top that says who writes it.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::PackError;
use crate::schema::{Dialect, SchemaValidator};
use crate::types::PackLockEntry;

/// The lock file's name, next to `ctx.toml`.
pub const LOCK_FILE: &str = "ctx.lock";

const HEADER: &str = "# ctx.lock: the packs installed in packs/, pinned (commit and SHA-256 of every file).\n\
# Written by `ctx tool install/update/remove`; do not edit by hand. Commit it with ctx.toml.\n\n";

/// The installed packs, by name.
#[derive(Clone, Debug, Default)]
pub struct Lock {
    pub packs: Vec<PackLockEntry>,
}

impl Lock {
    /// `ctx.lock` in the config's folder.
    pub fn path(base_dir: &Path) -> PathBuf {
        base_dir.join(LOCK_FILE)
    }

    /// The lock file, or `None` when there is none.
    pub fn read(base_dir: &Path) -> Result<Option<Lock>, PackError> {
        let path = Lock::path(base_dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(PackError::Lock { path: LOCK_FILE.into(), message: format!("cannot read it: {e}") }),
        };
        Lock::parse(&text).map(Some)
    }

    /// The lock file, empty when there is none.
    pub fn load(base_dir: &Path) -> Result<Lock, PackError> {
        Ok(Lock::read(base_dir)?.unwrap_or_default())
    }

    pub fn parse(text: &str) -> Result<Lock, PackError> {
        let fail = |message: String| PackError::Lock { path: LOCK_FILE.into(), message };
        let table: toml::Table =
            toml::from_str(text).map_err(|e| fail(format!("not valid TOML: {}", e.message().trim())))?;
        let value = serde_json::to_value(table).map_err(|e| fail(e.to_string()))?;
        let problems: Vec<String> = SchemaValidator::for_definition("PackLock")
            .problems(&value, Dialect::Toml)
            .into_iter()
            .map(|p| format!("{}: {}", p.dotted(), p.message))
            .collect();
        if !problems.is_empty() {
            return Err(fail(problems.join("; ")));
        }
        let lock: crate::types::PackLock = serde_json::from_value(value).map_err(|e| fail(e.to_string()))?;
        Ok(Lock { packs: lock.pack })
    }

    /// Writes the lock file whole (a temporary file renamed over it), or removes it when no
    /// pack is left.
    pub fn write(&self, base_dir: &Path) -> Result<(), PackError> {
        let path = Lock::path(base_dir);
        if self.packs.is_empty() {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(PackError::io(format!("cannot remove {LOCK_FILE}"))(e))
                }
                _ => Ok(()),
            };
        }
        let mut packs = self.packs.clone();
        packs.sort_by(|a, b| a.name.as_str().cmp(b.name.as_str()));
        let lock = crate::types::PackLock { version: 1, pack: packs };
        let body =
            toml::to_string(&lock).map_err(|e| PackError::Lock { path: LOCK_FILE.into(), message: e.to_string() })?;
        let tmp = base_dir.join(format!(".{LOCK_FILE}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, format!("{HEADER}{body}"))
            .map_err(PackError::io(format!("cannot write {}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            PackError::io(format!("cannot write {LOCK_FILE}"))(e)
        })
    }

    pub fn get(&self, name: &str) -> Option<&PackLockEntry> {
        self.packs.iter().find(|p| p.name.as_str() == name)
    }

    pub fn names(&self) -> Vec<String> {
        self.packs.iter().map(|p| p.name.to_string()).collect()
    }

    /// Adds `entry`, or replaces the entry of the same name.
    pub fn upsert(&mut self, entry: PackLockEntry) {
        self.packs.retain(|p| p.name != entry.name);
        self.packs.push(entry);
    }

    pub fn remove(&mut self, name: &str) -> Option<PackLockEntry> {
        let at = self.packs.iter().position(|p| p.name.as_str() == name)?;
        Some(self.packs.remove(at))
    }
}

/// Builds a lock entry from plain values (the generated type's fields check their patterns).
pub fn entry(value: Value) -> Result<PackLockEntry, PackError> {
    serde_json::from_value(value)
        .map_err(|e| PackError::Lock { path: LOCK_FILE.into(), message: format!("internal: {e}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_round_trips_and_a_bad_one_names_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let mut lock = Lock::default();
        lock.upsert(
            entry(serde_json::json!({
                "name": "jira", "version": "1.0.0", "source": "./p", "kind": "path", "folder": "packs/jira",
                "files": {"pack.toml": "a".repeat(64)}, "hosts": ["x.example.com"],
            }))
            .unwrap(),
        );
        lock.write(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(LOCK_FILE)).unwrap();
        assert!(text.starts_with("# ctx.lock"), "{text}");
        let back = Lock::load(dir.path()).unwrap();
        assert_eq!(back.packs, lock.packs);
        let bad = text.replace("packs/jira", "../../etc");
        let err = Lock::parse(&bad).unwrap_err().to_string();
        assert!(err.contains("pack.0.folder"), "{err}");
        Lock::default().write(dir.path()).unwrap();
        assert!(!dir.path().join(LOCK_FILE).exists());
    }
}
