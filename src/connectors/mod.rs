//! Connectors read a source (a folder, a git repository, a Lua script) into [`Item`]s for sync.
//!
//! A connector streams items to a callback instead of returning them all, so a sync of a large
//! source keeps only one document in memory at a time.

pub mod extract;
pub mod filesystem;
pub mod front_matter;
pub mod git;
mod html;
pub mod lua;
pub mod state;

use serde_json::Value;

/// One document as a connector produced it, before chunking.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// Stable id within the source (a relative path for files).
    pub source_id: String,
    pub title: String,
    pub body: String,
    pub content_type: String,
    pub source_url: Option<String>,
    pub author: Option<String>,
    /// RFC 3339, UTC. `None` means "same as updated_at".
    pub created_at: Option<String>,
    /// RFC 3339, UTC.
    pub updated_at: String,
    /// Source-specific metadata (`Value::Null` for none).
    pub metadata: Value,
}

/// Why a connector skipped an entry without producing an item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    Binary,
    TooLarge {
        bytes: u64,
        limit: u64,
    },
    /// A compressed file that unpacks to more than the limit; unpacking stopped there, so its
    /// full size is unknown.
    TooLargeUnpacked {
        limit: u64,
    },
    Unreadable(String),
    Invalid(String),
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SkipReason::Binary => write!(f, "binary file"),
            SkipReason::TooLarge { bytes, limit } => {
                write!(f, "{bytes} bytes is over the {limit}-byte limit")
            }
            SkipReason::TooLargeUnpacked { limit } => write!(f, "unpacks to over the {limit}-byte limit"),
            SkipReason::Unreadable(why) => write!(f, "unreadable: {why}"),
            SkipReason::Invalid(why) => write!(f, "invalid item: {why}"),
        }
    }
}

impl SkipReason {
    /// The reason without its details, for counting skips: `binary`, `too_large`, `unreadable`
    /// or `invalid`.
    pub fn kind(&self) -> &'static str {
        match self {
            SkipReason::Binary => "binary",
            SkipReason::TooLarge { .. } | SkipReason::TooLargeUnpacked { .. } => "too_large",
            SkipReason::Unreadable(_) => "unreadable",
            SkipReason::Invalid(_) => "invalid",
        }
    }
}

/// What a connector reports as it scans.
// Events are moved straight into the sink, never stored, so the size gap costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Event {
    Item(Item),
    Skipped {
        source_id: String,
        reason: SkipReason,
    },
    /// Sent last, by a connector whose scan says more than its items (a Lua connector), once
    /// the scan has succeeded.
    End(ScanEnd),
}

/// What a scan says besides its items.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScanEnd {
    /// The state to keep for the next sync (a Lua connector's `context.state`); `None` keeps the
    /// saved one. Sync saves it with the source's documents, and only if the sync succeeds.
    pub state: Option<serde_json::Map<String, Value>>,
    /// `Some` when the scan returned only what changed (`{items = ..., deleted = ...}`): the
    /// documents with these source ids are deleted and every other one is kept. `None` when it
    /// returned every item: the documents it did not return are deleted.
    pub deleted: Option<Vec<String>>,
}

/// A failure of a whole source (missing root, clone failed, script error). Other sources still sync.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    #[error("{0}")]
    Source(String),
    #[error("stopped: {0}")]
    Sink(String),
}

/// The receiver of scan events. Returning an error stops the scan.
pub type Sink<'a> = dyn FnMut(Event) -> Result<(), String> + 'a;

/// Content type by file extension; `text/plain` for anything unrecognised.
pub fn content_type_for(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "md" | "markdown" | "mdx" => "text/markdown",
        "html" | "htm" => "text/html",
        "json" => "application/json",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "xml" => "application/xml",
        "csv" => "text/csv",
        "rs" => "text/x-rust",
        "py" => "text/x-python",
        "js" | "mjs" | "cjs" => "text/javascript",
        "ts" | "tsx" => "text/x-typescript",
        "go" => "text/x-go",
        "java" => "text/x-java",
        "c" | "h" => "text/x-c",
        "cpp" | "cc" | "hpp" => "text/x-c++",
        "sh" | "bash" => "text/x-shellscript",
        "lua" => "text/x-lua",
        "sql" => "application/sql",
        "rst" => "text/x-rst",
        _ => "text/plain",
    }
}

/// True when the bytes look binary: a NUL in the first 8 KiB, like git's own heuristic.
pub fn looks_binary(bytes: &[u8]) -> bool {
    bytes.iter().take(8192).any(|&b| b == 0)
}

/// Decodes text, replacing invalid UTF-8. The flag says whether anything was replaced.
pub fn decode_lossy(bytes: Vec<u8>) -> (String, bool) {
    match String::from_utf8(bytes) {
        Ok(text) => (text, false),
        Err(e) => (String::from_utf8_lossy(e.as_bytes()).into_owned(), true),
    }
}

/// The document title: for markdown, the first `# ` heading, else the path within the source
/// (`guide/install/copyright`: many files share a bare name). A front matter `title:` comes
/// first; [`extract`](extract::extract) reads it.
pub fn title_for(path: &str, body: &str, content_type: &str) -> String {
    if content_type == "text/markdown" {
        let mut in_fence = false;
        for line in body.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
                in_fence = !in_fence;
            } else if !in_fence {
                if let Some(h) = trimmed.strip_prefix("# ") {
                    let h = h.trim().trim_end_matches('#').trim();
                    if !h.is_empty() {
                        return h.to_string();
                    }
                }
            }
        }
    }
    path.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_from_heading_or_path() {
        assert_eq!(title_for("a/b.md", "```\n# not this\n```\n# Runbook\n", "text/markdown"), "Runbook");
        assert_eq!(title_for("a/notes.txt", "# not markdown", "text/plain"), "a/notes.txt");
        assert_eq!(title_for("guide/install/copyright", "text", "text/plain"), "guide/install/copyright");
    }
}
