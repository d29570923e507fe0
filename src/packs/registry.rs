//! A pack registry: a git repository or a folder (`[packs] registry`) with an `index.json`
//! (`pack-index.schema.json`) that lists its packs, for search and install by name.

use std::path::{Path, PathBuf};

use super::fetch::{Source, Workspace};
use super::{files, git, PackError};
use crate::schema::{Dialect, SchemaValidator};
use crate::types::PackIndexEntry;

/// The index file at the root of a registry.
pub const INDEX: &str = "index.json";

/// A registry's index, read from its folder (or from a fresh clone of it).
#[derive(Debug)]
pub struct Index {
    pub entries: Vec<PackIndexEntry>,
    /// The registry's folder (or clone).
    pub root: PathBuf,
    /// The registry as configured, resolved: a URL, or an absolute path.
    pub url: String,
    pub reference: Option<String>,
    /// The commit cloned, for a git registry.
    pub commit: Option<String>,
}

/// Reads the configured registry; a git registry is cloned into `temp` (at `reference` when
/// given, else at the ref its setting names).
pub fn open(ws: &Workspace, temp: &Path, reference: Option<&str>) -> Result<Index, PackError> {
    let Some(configured) = ws.registry.as_deref() else {
        return Err(PackError::Registry(
            "no pack registry is configured; set [packs] registry = \"<git URL or folder>\" in ctx.toml (ctx's \
             repository ships one in examples/registry), or install from a folder or a git URL"
                .into(),
        ));
    };
    let source =
        Source::parse(configured, &ws.base_dir).map_err(|e| PackError::Registry(format!("[packs] registry: {e}")))?;
    let (root, url, reference, commit) = match source {
        Source::Path { dir } if reference.is_none() => (dir.clone(), dir.display().to_string(), None, None),
        Source::Path { dir } => {
            let clone = temp.join("registry");
            let url = dir.display().to_string();
            let commit = git::clone(&url, reference, &clone)?;
            (clone, url, reference.map(String::from), Some(commit))
        }
        Source::Git { url, subdir, reference: configured_ref } => {
            let clone = temp.join("registry");
            let reference = reference.map(String::from).or(configured_ref);
            let commit = git::clone(&url, reference.as_deref(), &clone)?;
            let root = match subdir {
                Some(sub) => clone.join(sub),
                None => clone,
            };
            (root, url, reference, Some(commit))
        }
        Source::Registry { .. } => {
            return Err(PackError::Registry(format!(
                "[packs] registry = {configured:?} is neither a folder nor a git URL"
            )))
        }
    };
    let entries = read_index(&root)?;
    Ok(Index { entries, root, url, reference, commit })
}

fn read_index(root: &Path) -> Result<Vec<PackIndexEntry>, PackError> {
    let path = root.join(INDEX);
    let fail = |message: String| PackError::Registry(format!("the registry's {INDEX}: {message}"));
    let meta = std::fs::symlink_metadata(&path).map_err(|e| fail(format!("cannot read {}: {e}", path.display())))?;
    if !meta.is_file() || meta.len() > files::CAPS.file_bytes {
        return Err(fail("is not a regular file of at most 1 MiB".into()));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| fail(e.to_string()))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| fail(format!("not valid JSON: {e}")))?;
    let problems: Vec<String> = SchemaValidator::for_definition("PackIndex")
        .problems(&value, Dialect::Json)
        .into_iter()
        .map(|p| format!("{}: {}", p.pointer(), p.message))
        .collect();
    if !problems.is_empty() {
        return Err(fail(problems.join("; ")));
    }
    let index: crate::types::PackIndex = serde_json::from_value(value).map_err(|e| fail(e.to_string()))?;
    Ok(index.packs)
}

impl Index {
    /// The folder inside the registry of the pack `entry` names: a pack's name, or a folder of
    /// the registry (`owner/repo/path` style).
    pub fn resolve(&self, entry: &str) -> Result<String, PackError> {
        if let Some(found) = self.entries.iter().find(|e| e.name.as_str() == entry) {
            return Ok(found.path.to_string());
        }
        if let Some(found) = self.entries.iter().find(|e| e.path.trim_end_matches('/') == entry.trim_end_matches('/')) {
            return Ok(found.path.to_string());
        }
        if entry.contains('/') && self.root.join(entry).is_dir() {
            return Ok(entry.to_string());
        }
        Err(PackError::Registry(format!(
            "the registry {} has no pack {entry:?}; `ctx tool search WORDS` lists what it has",
            self.url
        )))
    }
}

/// The entries that match every word (case-insensitive) in their name, description or
/// keywords; all of them when there is no word.
pub fn search<'a>(entries: &'a [PackIndexEntry], words: &[String]) -> Vec<&'a PackIndexEntry> {
    let words: Vec<String> = words.iter().flat_map(|w| w.split_whitespace()).map(str::to_lowercase).collect();
    entries
        .iter()
        .filter(|e| {
            let text = format!("{} {} {}", e.name.as_str(), e.description, e.keywords.join(" ")).to_lowercase();
            words.iter().all(|w| text.contains(w.as_str()))
        })
        .collect()
}
