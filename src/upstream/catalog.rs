//! Listing an upstream's tools, resources, resource templates and prompts: every page, with a
//! cap against a server that repeats its cursor, tools filtered by the section's globs.
//!
//! An upstream decides how much it lists, and what ctx keeps of it is held in memory, compiled
//! (each tool's schema) and sent to every client: so each list is bounded in entries, in bytes
//! per entry and in bytes overall, and an entry whose name (URI) came earlier is dropped.

use std::collections::HashSet;
use std::time::Duration;

use rmcp::model::{ClientRequest, PaginatedRequestParams, RequestOptionalParam};
use rmcp::service::{Peer, RoleClient};
use serde_json::{Map, Value as Json};

use super::client::{self, Failure, PROMPTS, RESOURCES, TOOLS};
use super::sniff::Executions;
use crate::config::upstream::UpstreamSection;

/// The most pages read of one list; a server past it is cut off (and logged).
pub const MAX_PAGES: usize = 100;
/// The most entries kept of one list (tools, resources, templates or prompts) of one server.
pub const MAX_ENTRIES: usize = 2000;
/// The largest entry kept, as JSON (a tool with its schemas); a larger one is left out.
pub const MAX_ENTRY_BYTES: usize = 256 * 1024;
/// The most JSON kept of one list of one server.
pub const MAX_LIST_BYTES: usize = 32 * 1024 * 1024;

/// One server's lists, as the catalog keeps them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lists {
    pub tools: Vec<Map<String, Json>>,
    pub resources: Vec<Map<String, Json>>,
    pub resource_templates: Vec<Map<String, Json>>,
    pub prompts: Vec<Map<String, Json>>,
    pub has_resources: bool,
}

impl Lists {
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
            && self.resources.is_empty()
            && self.resource_templates.is_empty()
            && self.prompts.is_empty()
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Tools,
    Resources,
    ResourceTemplates,
    Prompts,
}

impl Kind {
    /// The key that identifies an entry: a second entry with the same one is dropped.
    fn key(self) -> &'static str {
        match self {
            Kind::Tools | Kind::Prompts => "name",
            Kind::Resources => "uri",
            Kind::ResourceTemplates => "uriTemplate",
        }
    }

    fn field(self) -> &'static str {
        match self {
            Kind::Tools => "tools",
            Kind::Resources => "resources",
            Kind::ResourceTemplates => "resourceTemplates",
            Kind::Prompts => "prompts",
        }
    }

    fn request(self, cursor: Option<String>) -> ClientRequest {
        let params = PaginatedRequestParams::default().with_cursor(cursor);
        match self {
            Kind::Tools => ClientRequest::ListToolsRequest(RequestOptionalParam::with_param(params)),
            Kind::Resources => ClientRequest::ListResourcesRequest(RequestOptionalParam::with_param(params)),
            Kind::ResourceTemplates => {
                ClientRequest::ListResourceTemplatesRequest(RequestOptionalParam::with_param(params))
            }
            Kind::Prompts => ClientRequest::ListPromptsRequest(RequestOptionalParam::with_param(params)),
        }
    }
}

/// Relists the lists in `which` (bits of [`TOOLS`], [`RESOURCES`], [`PROMPTS`]) into `lists`,
/// for what the server's capabilities declare. A failed tools listing fails the whole call; a
/// failed resources or prompts listing is logged and leaves that list empty.
pub async fn relist(
    peer: &Peer<RoleClient>,
    section: &UpstreamSection,
    executions: &Executions,
    which: u8,
    limit: Duration,
    lists: &mut Lists,
) -> Result<(), String> {
    let caps = peer.peer_info().map(|info| info.capabilities.clone()).unwrap_or_default();
    lists.has_resources = caps.resources.is_some();
    if which & TOOLS != 0 {
        // What the answers to this listing say, and nothing older (see `sniff`).
        executions.clear();
        let allowed = section.tool_filter();
        lists.tools = if caps.tools.is_some() {
            list(peer, Kind::Tools, limit, &section.name)
                .await
                .map_err(|e| format!("tools/list failed: {}", describe(e)))?
                .into_iter()
                .filter(|t| t.get("name").and_then(Json::as_str).is_some_and(&allowed))
                .collect()
        } else {
            Vec::new()
        };
        executions.restore(&mut lists.tools);
    }
    if which & RESOURCES != 0 {
        let (resources, templates) = if caps.resources.is_some() {
            (
                optional(list(peer, Kind::Resources, limit, &section.name).await, section, "resources/list"),
                optional(
                    list(peer, Kind::ResourceTemplates, limit, &section.name).await,
                    section,
                    "resources/templates/list",
                ),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        lists.resources = resources;
        lists.resource_templates = templates;
    }
    if which & PROMPTS != 0 {
        lists.prompts = if caps.prompts.is_some() {
            optional(list(peer, Kind::Prompts, limit, &section.name).await, section, "prompts/list")
        } else {
            Vec::new()
        };
    }
    Ok(())
}

fn optional(
    r: Result<Vec<Map<String, Json>>, Failure>,
    section: &UpstreamSection,
    what: &str,
) -> Vec<Map<String, Json>> {
    r.unwrap_or_else(|e| {
        tracing::warn!(server = %section.name, "upstream {what} failed: {}", describe(e));
        Vec::new()
    })
}

pub fn describe(f: Failure) -> String {
    match f {
        Failure::Timeout => "no answer in time".to_string(),
        Failure::Rpc { code, message, .. } => format!("error {code}: {message}"),
        Failure::Disconnected(m) => m,
    }
}

async fn list(
    peer: &Peer<RoleClient>,
    kind: Kind,
    limit: Duration,
    server: &str,
) -> Result<Vec<Map<String, Json>>, Failure> {
    let mut kept = Kept::default();
    let mut cursor: Option<String> = None;
    let mut seen = HashSet::new();
    for _ in 0..MAX_PAGES {
        let page = client::request(peer, kind.request(cursor.take()), limit, None).await?;
        if let Some(Json::Array(entries)) = page.get(kind.field()) {
            for entry in entries.iter().filter_map(Json::as_object) {
                kept.add(kind, entry);
            }
        }
        if kept.full {
            break;
        }
        match page.get("nextCursor").and_then(Json::as_str) {
            None => return Ok(kept.finish(kind, server)),
            Some(next) if !seen.insert(next.to_string()) => {
                tracing::warn!(
                    server,
                    "upstream {} repeated its cursor; keeping the {} entries read",
                    kind.field(),
                    kept.items.len()
                );
                return Ok(kept.finish(kind, server));
            }
            Some(next) => cursor = Some(next.to_string()),
        }
    }
    if !kept.full {
        tracing::warn!(
            server,
            "upstream {} has more than {MAX_PAGES} pages; keeping the first {}",
            kind.field(),
            kept.items.len()
        );
    }
    Ok(kept.finish(kind, server))
}

/// The entries of one list kept so far, within the bounds, and what was left out.
#[derive(Default)]
struct Kept {
    items: Vec<Map<String, Json>>,
    keys: HashSet<String>,
    bytes: usize,
    duplicates: usize,
    oversized: Vec<String>,
    /// A bound was reached: the rest of the list is left out.
    full: bool,
}

impl Kept {
    fn add(&mut self, kind: Kind, entry: &Map<String, Json>) {
        if self.full {
            return;
        }
        let key = entry.get(kind.key()).and_then(Json::as_str).unwrap_or_default();
        if self.keys.contains(key) {
            self.duplicates += 1;
            return;
        }
        let size = crate::contract::text::json_size(entry);
        if size > MAX_ENTRY_BYTES {
            // The key itself may be the huge part: keep only its start for the message.
            self.oversized.push(key.chars().take(64).collect());
            return;
        }
        if self.items.len() >= MAX_ENTRIES || self.bytes + size > MAX_LIST_BYTES {
            self.full = true;
            return;
        }
        self.bytes += size;
        self.keys.insert(key.to_string());
        self.items.push(entry.clone());
    }

    fn finish(self, kind: Kind, server: &str) -> Vec<Map<String, Json>> {
        let what = kind.field();
        if self.full {
            tracing::warn!(
                server,
                "upstream {what}: keeping the first {} entries ({} KiB); ctx keeps at most {MAX_ENTRIES} entries and {} MiB of one list",
                self.items.len(),
                self.bytes / 1024,
                MAX_LIST_BYTES >> 20
            );
        }
        if self.duplicates > 0 {
            tracing::warn!(
                server,
                "upstream {what}: {} entries repeat a {} listed before; left out",
                self.duplicates,
                kind.key()
            );
        }
        if !self.oversized.is_empty() {
            tracing::warn!(
                server,
                "upstream {what}: {} entries are over {} KiB of JSON each and are left out: {:?}",
                self.oversized.len(),
                MAX_ENTRY_BYTES / 1024,
                self.oversized.iter().take(5).collect::<Vec<_>>()
            );
        }
        self.items
    }
}
