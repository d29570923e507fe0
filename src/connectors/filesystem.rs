//! Filesystem connector: the text files under a folder, filtered by globs and `.gitignore`.

use std::path::Path;
use std::time::SystemTime;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde_json::json;

use super::extract::extract;
use super::{ConnectorError, Event, Item, Sink, SkipReason};
use crate::types::FilesystemConnectorConfig;

pub struct FilesystemConnector<'a> {
    pub name: &'a str,
    pub config: &'a FilesystemConnectorConfig,
    /// Folder of ctx.toml; a relative root resolves against it.
    pub base_dir: &'a Path,
}

impl FilesystemConnector<'_> {
    /// Streams every matching file under the root to `sink`.
    pub fn scan(&self, sink: &mut Sink<'_>) -> Result<(), ConnectorError> {
        let root = self.base_dir.join(self.config.root.as_str());
        if !root.is_dir() {
            return Err(ConnectorError::Source(format!(
                "root folder {:?} does not exist (connectors.filesystem.{}.root, resolved to {})",
                self.config.root.as_str(),
                self.name,
                root.display()
            )));
        }
        let include = globs(&self.config.include, "include")?;
        let exclude = globs(&self.config.exclude, "exclude")?;
        let limit = self.config.max_file_bytes;
        let walker = ignore::WalkBuilder::new(&root)
            .standard_filters(self.config.respect_gitignore)
            // Hidden files stay out even without gitignore rules: .git, editor swap files.
            .hidden(true)
            .follow_links(false)
            .require_git(false)
            .sort_by_file_name(|a, b| a.cmp(b))
            .build();
        for entry in walker {
            let entry = match entry {
                Ok(entry) => entry,
                Err(err) => {
                    let id = err_path(&err).unwrap_or_else(|| "(unknown)".to_string());
                    sink(Event::Skipped { source_id: id, reason: SkipReason::Unreadable(err.to_string()) })
                        .map_err(ConnectorError::Sink)?;
                    continue;
                }
            };
            let Some(file_type) = entry.file_type() else {
                continue;
            };
            if file_type.is_dir() {
                continue;
            }
            let rel = match entry.path().strip_prefix(&root) {
                Ok(rel) => rel.to_string_lossy().replace('\\', "/"),
                Err(_) => continue,
            };
            if !include.is_match(&rel) || exclude.is_match(&rel) {
                continue;
            }
            // Symlinks to files are read through; broken ones are reported. Symlinked folders
            // are not followed, so a link cannot pull in a whole tree from elsewhere.
            let meta = match std::fs::metadata(entry.path()) {
                Ok(meta) if meta.is_file() => meta,
                Ok(_) => continue,
                Err(e) => {
                    let why = if file_type.is_symlink() { format!("broken symlink ({e})") } else { e.to_string() };
                    sink(Event::Skipped { source_id: rel, reason: SkipReason::Unreadable(why) })
                        .map_err(ConnectorError::Sink)?;
                    continue;
                }
            };
            if meta.len() > limit {
                sink(Event::Skipped { source_id: rel, reason: SkipReason::TooLarge { bytes: meta.len(), limit } })
                    .map_err(ConnectorError::Sink)?;
                continue;
            }
            let bytes = match std::fs::read(entry.path()) {
                Ok(bytes) => bytes,
                Err(e) => {
                    sink(Event::Skipped { source_id: rel, reason: SkipReason::Unreadable(e.to_string()) })
                        .map_err(ConnectorError::Sink)?;
                    continue;
                }
            };
            let file = match extract(&rel, bytes, limit) {
                Ok(file) => file,
                Err(reason) => {
                    sink(Event::Skipped { source_id: rel, reason }).map_err(ConnectorError::Sink)?;
                    continue;
                }
            };
            let updated_at = meta.modified().ok().and_then(rfc3339).unwrap_or_else(crate::contract::time::now_rfc3339);
            let created_at = meta.created().ok().and_then(rfc3339);
            let mut metadata = serde_json::Map::new();
            if file.lossy {
                metadata.insert("lossy_utf8".to_string(), json!(true));
            }
            if let Some(front) = file.front_matter {
                metadata.insert("front_matter".to_string(), serde_json::Value::Object(front));
            }
            let metadata =
                if metadata.is_empty() { serde_json::Value::Null } else { serde_json::Value::Object(metadata) };
            let item = Item {
                title: file.title,
                source_id: rel,
                body: file.body,
                content_type: file.content_type.to_string(),
                source_url: None,
                author: None,
                created_at,
                updated_at,
                metadata,
            };
            sink(Event::Item(item)).map_err(ConnectorError::Sink)?;
        }
        Ok(())
    }
}

fn globs(patterns: &[String], key: &str) -> Result<GlobSet, ConnectorError> {
    let mut builder = GlobSetBuilder::new();
    for pattern in patterns {
        let glob = Glob::new(pattern)
            .map_err(|e| ConnectorError::Source(format!("{key} pattern {pattern:?} is not a valid glob: {e}")))?;
        builder.add(glob);
    }
    builder.build().map_err(|e| ConnectorError::Source(format!("{key} patterns: {e}")))
}

fn rfc3339(time: SystemTime) -> Option<String> {
    let secs = time.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs();
    crate::contract::time::unix_to_rfc3339(secs as i64)
}

fn err_path(err: &ignore::Error) -> Option<String> {
    match err {
        ignore::Error::WithPath { path, .. } => Some(path.display().to_string()),
        ignore::Error::WithDepth { err, .. } | ignore::Error::WithLineNumber { err, .. } => err_path(err),
        _ => None,
    }
}
