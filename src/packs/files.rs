//! A pack's files: walked without following links, checked against the caps, copied and hashed.
//!
//! The same walk serves install (copy into the staging folder) and the load-time check (hash in
//! place), so both see the same files by the same relative names.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::PackError;
use crate::contract::text::hex;

/// How big a pack may be. A pack is a handful of scripts; anything near these caps is a
/// mistake or an attack (a clone that fills the disk, a file the check would hash forever).
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    /// Largest single file, in bytes.
    pub file_bytes: u64,
    /// All files together, in bytes.
    pub total_bytes: u64,
    /// Number of files.
    pub files: usize,
    /// Folder depth below the pack's root.
    pub depth: usize,
}

/// The caps every pack command uses.
pub const CAPS: Caps = Caps { file_bytes: 1024 * 1024, total_bytes: 16 * 1024 * 1024, files: 256, depth: 12 };

/// One regular file of a pack.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Relative to the pack's root, '/'-separated.
    pub rel: String,
    pub path: PathBuf,
    pub size: u64,
}

/// Every regular file under `root`, sorted by relative name, or the first thing refused: a
/// symbolic link (wherever it points), a device, pipe or socket, a name that is not plain
/// UTF-8, a file over the caps. `.git` at the top (a clone's own repository) is left out; one
/// deeper is a pack's file like any other, so nothing can hide below it.
pub fn walk(root: &Path, caps: &Caps) -> Result<Vec<Entry>, PackError> {
    let mut out = Vec::new();
    let mut total = 0u64;
    let mut stack: Vec<(PathBuf, String, usize)> = vec![(root.to_path_buf(), String::new(), 0)];
    while let Some((dir, prefix, depth)) = stack.pop() {
        let read = std::fs::read_dir(&dir).map_err(PackError::io(format!("cannot read folder {}", dir.display())))?;
        for item in read {
            let item = item.map_err(PackError::io(format!("cannot read folder {}", dir.display())))?;
            let name = item.file_name();
            let Some(name) = name.to_str() else {
                return Err(unsafe_path(&prefix, &name.to_string_lossy(), "the name is not valid UTF-8"));
            };
            if name == ".git" && depth == 0 {
                continue;
            }
            let rel = if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") };
            if name.chars().any(|c| c.is_control() || c == '\\') {
                return Err(PackError::Unsafe {
                    path: rel,
                    why: "the name has a control character or a backslash".into(),
                });
            }
            // symlink_metadata: the link itself, never what it points at.
            let meta = std::fs::symlink_metadata(item.path()).map_err(PackError::io(format!("cannot read {rel}")))?;
            let kind = meta.file_type();
            if kind.is_symlink() {
                let target = std::fs::read_link(item.path()).map(|t| t.display().to_string()).unwrap_or_default();
                return Err(PackError::Unsafe {
                    path: rel,
                    why: format!(
                        "is a symbolic link (to {target:?}); packs may not contain links, copy the file in instead"
                    ),
                });
            }
            if kind.is_dir() {
                if depth + 1 > caps.depth {
                    return Err(PackError::Unsafe {
                        path: rel,
                        why: format!("folders nest deeper than {} levels", caps.depth),
                    });
                }
                stack.push((item.path(), rel, depth + 1));
                continue;
            }
            if !kind.is_file() {
                return Err(PackError::Unsafe {
                    path: rel,
                    why: "is not a regular file (a device, pipe or socket)".into(),
                });
            }
            if meta.len() > caps.file_bytes {
                return Err(PackError::Unsafe {
                    path: rel,
                    why: format!("is {} bytes, over the cap of {} bytes per file", meta.len(), caps.file_bytes),
                });
            }
            total += meta.len();
            if total > caps.total_bytes {
                return Err(PackError::Unsafe {
                    path: rel,
                    why: format!("the pack's files come to more than {} bytes, the cap per pack", caps.total_bytes),
                });
            }
            out.push(Entry { rel, path: item.path(), size: meta.len() });
            if out.len() > caps.files {
                return Err(PackError::Unsafe {
                    path: out[out.len() - 1].rel.clone(),
                    why: format!("the pack has more than {} files, the cap per pack", caps.files),
                });
            }
        }
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

fn unsafe_path(prefix: &str, name: &str, why: &str) -> PackError {
    let path = if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") };
    PackError::Unsafe { path, why: why.to_string() }
}

/// Reads one walked file, at most the cap (a file that grew since the walk is refused).
pub fn read(entry: &Entry, caps: &Caps) -> Result<Vec<u8>, PackError> {
    let file = std::fs::File::open(&entry.path).map_err(PackError::io(format!("cannot read {}", entry.rel)))?;
    let mut bytes = Vec::with_capacity(entry.size as usize);
    file.take(caps.file_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(PackError::io(format!("cannot read {}", entry.rel)))?;
    if bytes.len() as u64 > caps.file_bytes {
        return Err(PackError::Unsafe {
            path: entry.rel.clone(),
            why: format!("grew past the cap of {} bytes per file while it was read", caps.file_bytes),
        });
    }
    Ok(bytes)
}

/// SHA-256 as lower-case hex.
pub fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Copies the pack at `from` into `to` (which must not exist) and returns every file's SHA-256
/// by relative name. Nothing is written outside `to`.
pub fn copy(from: &Path, to: &Path, caps: &Caps) -> Result<BTreeMap<String, String>, PackError> {
    let entries = walk(from, caps)?;
    std::fs::create_dir(to).map_err(PackError::io(format!("cannot create {}", to.display())))?;
    let mut hashes = BTreeMap::new();
    for entry in &entries {
        let bytes = read(entry, caps)?;
        // Built from checked names only: no component is `..`, absolute or a link.
        let target = entry.rel.split('/').fold(to.to_path_buf(), |p, part| p.join(part));
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(PackError::io(format!("cannot create {}", parent.display())))?;
        }
        std::fs::write(&target, &bytes).map_err(PackError::io(format!("cannot write {}", target.display())))?;
        hashes.insert(entry.rel.clone(), sha256(&bytes));
    }
    Ok(hashes)
}

/// Every file's SHA-256 under `root`, by relative name, read in place.
pub fn hash(root: &Path, caps: &Caps) -> Result<BTreeMap<String, String>, PackError> {
    let mut hashes = BTreeMap::new();
    for entry in walk(root, caps)? {
        let bytes = read(&entry, caps)?;
        hashes.insert(entry.rel, sha256(&bytes));
    }
    Ok(hashes)
}

/// A relative path inside a pack, as a manifest names it: '/'-separated, not absolute, without
/// `..`, `.`, empty parts or backslashes. `Err` says what is wrong.
pub fn check_relative(path: &str) -> Result<(), String> {
    if path.starts_with('/') || path.starts_with('\\') || path.get(1..3) == Some(":\\") || path.get(1..3) == Some(":/")
    {
        return Err("is an absolute path; name a file inside the pack, relative to its folder".into());
    }
    if path.contains('\\') {
        return Err("has a backslash; separate folders with '/'".into());
    }
    for part in path.split('/') {
        match part {
            ".." => return Err("has '..'; a pack's paths stay inside its folder".into()),
            "." | "" => return Err("has an empty or '.' part; write the plain relative path".into()),
            _ => {}
        }
        if part.chars().any(char::is_control) {
            return Err("has a control character".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_stay_inside() {
        assert!(check_relative("tools/a.lua").is_ok());
        for bad in ["/etc/passwd", "../x.lua", "tools/../../x.lua", "a//b.lua", "./a.lua", "a\\b.lua", "C:/x.lua"] {
            assert!(check_relative(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn walk_refuses_links_and_caps() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("tools")).unwrap();
        std::fs::write(dir.path().join("tools/a.lua"), "x").unwrap();
        std::fs::create_dir(dir.path().join(".git")).unwrap();
        std::fs::write(dir.path().join(".git/HEAD"), "ref").unwrap();
        let found = walk(dir.path(), &CAPS).unwrap();
        assert_eq!(found.iter().map(|e| e.rel.as_str()).collect::<Vec<_>>(), ["tools/a.lua"]);
        let small = Caps { file_bytes: 0, ..CAPS };
        assert!(walk(dir.path(), &small).unwrap_err().to_string().contains("tools/a.lua"));
        std::os::unix::fs::symlink("/etc", dir.path().join("tools/out")).unwrap();
        let err = walk(dir.path(), &CAPS).unwrap_err().to_string();
        assert!(err.contains("tools/out") && err.contains("symbolic link"), "{err}");
    }
}
