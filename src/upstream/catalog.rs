//! Listing an upstream's tools, resources, resource templates and prompts: every page, with a
//! cap against a server that repeats its cursor, tools filtered by the section's globs.

use std::collections::HashSet;
use std::time::Duration;

use rmcp::model::{ClientRequest, PaginatedRequestParams, RequestOptionalParam};
use rmcp::service::{Peer, RoleClient};
use serde_json::{Map, Value as Json};

use super::client::{self, Failure, PROMPTS, RESOURCES, TOOLS};
use crate::config::upstream::UpstreamSection;

/// The most pages read of one list; a server past it is cut off (and logged).
pub const MAX_PAGES: usize = 100;

/// One server's lists, as the catalog keeps them.
#[derive(Clone, Debug, Default)]
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
    which: u8,
    limit: Duration,
    lists: &mut Lists,
) -> Result<(), String> {
    let caps = peer.peer_info().map(|info| info.capabilities.clone()).unwrap_or_default();
    lists.has_resources = caps.resources.is_some();
    if which & TOOLS != 0 {
        lists.tools = if caps.tools.is_some() {
            list(peer, Kind::Tools, limit, &section.name)
                .await
                .map_err(|e| format!("tools/list failed: {}", describe(e)))?
                .into_iter()
                .filter(|t| t.get("name").and_then(Json::as_str).is_some_and(|n| section.allows(n)))
                .collect()
        } else {
            Vec::new()
        };
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
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    let mut seen = HashSet::new();
    for _ in 0..MAX_PAGES {
        let page = client::request(peer, kind.request(cursor.take()), limit, None).await?;
        if let Some(Json::Array(entries)) = page.get(kind.field()) {
            items.extend(entries.iter().filter_map(|e| e.as_object().cloned()));
        }
        match page.get("nextCursor").and_then(Json::as_str) {
            None => return Ok(items),
            Some(next) if !seen.insert(next.to_string()) => {
                tracing::warn!(
                    server,
                    "upstream {} repeated its cursor; keeping the {} entries read",
                    kind.field(),
                    items.len()
                );
                return Ok(items);
            }
            Some(next) => cursor = Some(next.to_string()),
        }
    }
    tracing::warn!(
        server,
        "upstream {} has more than {MAX_PAGES} pages; keeping the first {}",
        kind.field(),
        items.len()
    );
    Ok(items)
}
