//! The knowledge base: SQLite store, chunking, sync and search.
//!
//! [`Kb`] is the library API. The CLI, the built-in tools and the Lua context bridge all call
//! it, so it holds no CLI or HTTP concerns.

pub mod budget;
pub mod chunk;
pub mod connector_state;
pub mod embedding;
mod error;
pub mod filler;
mod mirror;
pub mod pg_store;
mod pool;
pub mod prune;
pub mod query;
pub mod search;
mod snippet;
pub mod store;
pub mod sync;
mod term_rank;
mod topk;
pub mod vectors;

use std::sync::{Arc, Mutex};

pub use error::KbError;
pub use store::{SqliteStore, Stats, Store};

use crate::config::Config;
// The one date format of stored documents; in the contract, since connectors write it too.
pub use crate::contract::time::{normalize_date, now_rfc3339, unix_to_rfc3339};
use crate::embed::Embedder;
use crate::types::{Document, SearchRequest, SearchResponse, SourceStatus, SourceStatusType, SourcesResponse};

/// Namespace of document ids: UUID v5 of `source` + "\n" + `source_id`.
const ID_NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6f0c_5b1e_2d7a_4c3e_9a51_8e0d_c7a4_1b29);

/// The stable id of a document.
pub fn document_id(source: &str, source_id: &str) -> String {
    uuid::Uuid::new_v5(&ID_NAMESPACE, format!("{source}\n{source_id}").as_bytes()).to_string()
}

/// How `config` has the keyword index tokenize text.
fn stemming(config: &Config) -> store::Stemming {
    match config.spec.retrieval.stemming {
        crate::types::RetrievalConfigStemming::English => store::Stemming::English,
        crate::types::RetrievalConfigStemming::None => store::Stemming::None,
    }
}

/// A replica's local copy of the shared knowledge base: beside where the SQLite one would be,
/// under its own name (a laptop's knowledge base is never mistaken for a copy).
pub fn copy_path(config: &Config) -> std::path::PathBuf {
    config.db_path().with_file_name("replica-kb.sqlite")
}

/// The knowledge base of one config: its store plus the configured sources.
#[derive(Clone)]
pub struct Kb {
    config: Arc<Config>,
    store: Arc<dyn Store>,
    /// The `[embedding]` provider, built on first use (a local model takes tens of
    /// milliseconds and tens of megabytes to load; keyword search never pays for it). A
    /// failure is not kept: a model installed later is picked up by the next search.
    embedder: Arc<Mutex<Option<Arc<dyn Embedder>>>>,
    /// The database replicas share (`[db] url`), opened and migrated by `app::open`.
    shared: Option<crate::db::Shared>,
}

impl Kb {
    /// Opens the SQLite store named by the config.
    pub fn open(config: Arc<Config>) -> Result<Kb, KbError> {
        let store = SqliteStore::open(&config.db_path(), stemming(&config))?;
        Ok(Kb { config, store: Arc::new(store), embedder: Arc::default(), shared: None })
    }

    /// [`Kb::open`] for a replica of a shared database: the state the other features keep
    /// goes there (see `app::open`).
    pub fn open_shared(config: Arc<Config>, shared: Option<crate::db::Shared>) -> Result<Kb, KbError> {
        let Some(shared) = shared else { return Kb::open(config) };
        let store = pg_store::PgStore::open(shared.pg.clone(), &copy_path(&config), stemming(&config))?;
        Ok(Kb { config, store: Arc::new(store), embedder: Arc::default(), shared: Some(shared) })
    }

    /// The shared database, when `[db] url` names one.
    pub fn shared(&self) -> Option<&crate::db::Shared> {
        self.shared.as_ref()
    }

    /// The same store under a reloaded config (hot reload keeps the open pool, and the
    /// embedder when `[embedding]` did not change).
    pub fn with_config(&self, config: Arc<Config>) -> Kb {
        let same = config.spec.embedding == self.config.spec.embedding && config.base_dir == self.config.base_dir;
        let embedder = if same { Arc::clone(&self.embedder) } else { Arc::default() };
        Kb { config, store: Arc::clone(&self.store), embedder, shared: self.shared.clone() }
    }

    /// The configured embedder: `Ok(None)` when `[embedding]` is disabled, an error saying
    /// what is wrong when it cannot be built.
    pub fn embedder(&self) -> Result<Option<Arc<dyn Embedder>>, KbError> {
        let mut built = self.embedder.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(embedder) = built.as_ref() {
            return Ok(Some(Arc::clone(embedder)));
        }
        let fresh = crate::embed::from_config(&self.config).map_err(|e| KbError::Embed(e.to_string()))?;
        built.clone_from(&fresh);
        Ok(fresh)
    }

    /// Whether sync leaves vectors to the background filler: `[embedding] background`, or the
    /// model's own default when unset (`false` without a model).
    pub fn embeds_in_background(&self) -> bool {
        match self.config.spec.embedding.background {
            Some(set) => set,
            None => self.embedder().ok().flatten().is_some_and(|e| e.background_by_default()),
        }
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    pub fn store(&self) -> &dyn Store {
        self.store.as_ref()
    }

    /// Configured sources as `type:name`, sorted.
    pub fn configured_sources(&self) -> Vec<(String, SourceStatusType)> {
        let spec = &self.config.spec.connectors;
        let mut out: Vec<(String, SourceStatusType)> = spec
            .filesystem
            .keys()
            .map(|n| (format!("filesystem:{}", n.as_str()), SourceStatusType::Filesystem))
            .chain(spec.git.keys().map(|n| (format!("git:{}", n.as_str()), SourceStatusType::Git)))
            .chain(spec.script.keys().map(|n| (format!("script:{}", n.as_str()), SourceStatusType::Script)))
            // A section an unset variable disables is still a source: sync reports why it fails.
            .chain(
                self.config
                    .broken_of(crate::config::ScriptKind::Connector)
                    .map(|b| (format!("script:{}", b.name), SourceStatusType::Script)),
            )
            .collect();
        out.sort();
        out
    }

    /// Configured sources plus any source that was synced before (and may still have documents).
    pub fn known_sources(&self) -> Result<Vec<String>, KbError> {
        let mut names: Vec<String> = self.configured_sources().into_iter().map(|(n, _)| n).collect();
        names.extend(self.store.source_names()?);
        names.sort();
        names.dedup();
        Ok(names)
    }

    pub fn search(&self, request: &SearchRequest) -> Result<SearchResponse, KbError> {
        // Sources are only needed to resolve a filter; don't pay for them otherwise.
        let known = if request.source.is_some() { self.known_sources()? } else { Vec::new() };
        // The embedder is built only for the modes that use it.
        let embedder = match request.mode {
            None | Some(crate::types::SearchMode::Keyword) => Ok(None),
            Some(_) => self.embedder(),
        };
        search::search(self.store.as_ref(), &self.config, &known, embedder, request)
    }

    pub fn get(&self, id: &str) -> Result<Document, KbError> {
        self.store.document(id)?.ok_or_else(|| KbError::NotFound(id.to_string()))
    }

    pub fn sources(&self) -> Result<SourcesResponse, KbError> {
        let rows = self.store.sources()?;
        let configured = self.configured_sources();
        let mut names: Vec<String> = configured.iter().map(|(n, _)| n.clone()).collect();
        names.extend(rows.iter().map(|r| r.source.clone()));
        names.sort();
        names.dedup();
        let sources = names
            .into_iter()
            .map(|name| {
                let row = rows.iter().find(|r| r.source == name);
                let kind = configured.iter().find(|(n, _)| *n == name).map(|(_, k)| *k);
                let ty = kind.unwrap_or(match name.split(':').next() {
                    Some("git") => SourceStatusType::Git,
                    Some("script") => SourceStatusType::Script,
                    _ => SourceStatusType::Filesystem,
                });
                let last_error = row.and_then(|r| r.last_error.clone());
                let notes = if kind.is_none() {
                    Some(
                        "no longer configured; its documents stay searchable until removed: run `ctx sources prune`"
                            .to_string(),
                    )
                } else if row.and_then(|r| r.last_sync.as_ref()).is_none() {
                    Some("never synced; run `ctx sync`".to_string())
                } else {
                    last_error.clone()
                };
                SourceStatus {
                    name: name.clone(),
                    type_: ty,
                    configured: kind.is_some(),
                    healthy: last_error.is_none(),
                    notes,
                    documents: row.map(|r| r.documents as u64).unwrap_or(0),
                    chunks: row.map(|r| r.chunks as u64).unwrap_or(0),
                    last_sync: row.and_then(|r| r.last_sync.clone()),
                    last_error,
                    last_sync_seconds: row.and_then(|r| r.last_duration_ms).map(|ms| ms as f64 / 1000.0),
                }
            })
            .collect();
        Ok(SourcesResponse { sources })
    }

    pub fn stats(&self) -> Result<Stats, KbError> {
        self.store.stats()
    }

    /// Chunking limits from the config.
    pub fn chunk_spec(&self) -> chunk::ChunkSpec {
        chunk::ChunkSpec {
            max_tokens: self.config.spec.chunking.max_tokens as usize,
            overlap_tokens: self.config.spec.chunking.overlap_tokens as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_distinct() {
        assert_eq!(document_id("filesystem:docs", "a.md"), document_id("filesystem:docs", "a.md"));
        assert_ne!(document_id("filesystem:docs", "a.md"), document_id("filesystem:other", "a.md"));
    }
}
