//! Pruning: removing what the store holds of sources the config no longer names.
//!
//! A renamed or deleted `[connectors.*]` section leaves its documents searchable (results
//! double after a rename). Sync never deletes them on its own: a section commented out for a
//! moment must not cost a full re-index. `ctx sources prune` does, one source per transaction.

use serde::Serialize;

use super::store::Removed;
use super::{Kb, KbError};

/// A source the store holds and the config does not name, with what it holds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Unconfigured {
    pub source: String,
    pub documents: i64,
    pub chunks: i64,
}

/// Every source with documents or a sync record that is not configured, by name.
pub fn unconfigured(kb: &Kb) -> Result<Vec<Unconfigured>, KbError> {
    let configured = kb.configured_sources();
    Ok(kb
        .store()
        .sources()?
        .into_iter()
        .filter(|row| !configured.iter().any(|(name, _)| *name == row.source))
        .map(|row| Unconfigured { source: row.source, documents: row.documents, chunks: row.chunks })
        .collect())
}

/// Removes one source's documents, chunks, index rows, vectors and sync records, all at once.
pub fn remove(kb: &Kb, source: &str) -> Result<Removed, KbError> {
    kb.store().remove_source(source)
}
