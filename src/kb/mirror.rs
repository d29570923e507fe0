//! A replica's local copy of the shared knowledge base: a SQLite store like the embedded one,
//! written only with what PostgreSQL holds (the same chunk ids), so keyword search keeps FTS5's
//! tokenizer, its exact BM25 posting lists and their speed, and semantic search its in-memory
//! index. [`Batch`] is what changed in PostgreSQL since the copy's generation; [`apply`] lands
//! it in one transaction.

use rusqlite::{params, OptionalExtension};

use super::store::SqliteStore;
use super::vectors;
use super::KbError;

/// A document as PostgreSQL holds it, with its chunks.
#[derive(Debug)]
pub struct Doc {
    pub id: String,
    pub source: String,
    pub source_id: String,
    pub title: String,
    pub body: String,
    pub content_type: String,
    pub source_url: Option<String>,
    pub author: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub metadata_json: String,
    pub content_hash: String,
    /// `(id, idx, text, tokens)`; title, source and updated_at are the document's.
    pub chunks: Vec<(i64, i64, String, i64)>,
}

/// A source's sync record: `(source, last_sync, last_error, syncs, failures, last_duration_ms)`.
pub type SyncRecord = (String, String, Option<String>, i64, i64, Option<i64>);

/// What changed in PostgreSQL between two generations.
#[derive(Debug, Default)]
pub struct Batch {
    /// The generation this batch brings the copy to.
    pub generation: i64,
    /// Everything, not a change: the copy is emptied first (a new copy, or one too far behind).
    pub full: bool,
    pub deleted: Vec<String>,
    pub documents: Vec<Doc>,
    /// `(chunk id, model, dims, vector bytes)`.
    pub vectors: Vec<(i64, String, i64, Vec<u8>)>,
    /// Every source's sync record.
    pub sync_state: Vec<SyncRecord>,
    /// Every script source's saved state: `(source, last_success, state_json)`.
    pub connector_state: Vec<(String, String, String)>,
}

/// The key of `store_meta` that holds the shared database's identity the copy was made from.
const SOURCE_KEY: &str = "mirror_of";
/// ... and the generation of PostgreSQL's knowledge base it holds.
const GENERATION_KEY: &str = "mirror_generation";

/// The identity and generation the copy holds: `(0, 0)` for a copy of nothing yet.
pub fn position(store: &SqliteStore) -> Result<(i64, i64), KbError> {
    let conn = store.pool().get()?;
    let read = |key: &str| -> Result<i64, KbError> {
        Ok(conn
            .query_row("SELECT value FROM store_meta WHERE key = ?1", [key], |r| r.get::<_, i64>(0))
            .optional()?
            .unwrap_or(0))
    };
    Ok((read(SOURCE_KEY)?, read(GENERATION_KEY)?))
}

/// Lands `batch` in the copy, in one transaction: readers see the old copy until it commits. A
/// copy already at or past the batch's generation is left as it is. A batch read from an older
/// generation than the copy holds is still right to apply: it holds the rows as they are now.
pub fn apply(store: &SqliteStore, instance: i64, batch: &Batch) -> Result<(), KbError> {
    let mut conn = store.pool().get()?;
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    // Another process on this folder (a `ctx sync` beside the server) may have brought the copy
    // further meanwhile: an older batch must not undo its newer rows.
    let held: i64 = tx
        .query_row("SELECT value FROM store_meta WHERE key = ?1", [GENERATION_KEY], |r| r.get(0))
        .optional()?
        .unwrap_or(0);
    if held >= batch.generation && !batch.full {
        return Ok(());
    }
    if batch.full {
        tx.execute_batch(
            "DELETE FROM chunk_vectors; DELETE FROM chunks; DELETE FROM documents;
             INSERT INTO chunks_fts (chunks_fts) VALUES ('delete-all');",
        )?;
    }
    // Gone, and changed (their chunks are replaced whole): the index rows first.
    let drop_doc = |id: &str| -> rusqlite::Result<()> {
        tx.prepare_cached(
            "INSERT INTO chunks_fts (chunks_fts, rowid, text, title)
             SELECT 'delete', id, text, title FROM chunks WHERE document_id = ?1",
        )?
        .execute([id])?;
        tx.prepare_cached("DELETE FROM documents WHERE id = ?1")?.execute([id])?;
        Ok(())
    };
    if !batch.full {
        for id in batch.deleted.iter().map(String::as_str).chain(batch.documents.iter().map(|d| d.id.as_str())) {
            drop_doc(id)?;
        }
    }
    for doc in &batch.documents {
        tx.prepare_cached(
            "INSERT INTO documents (id, source, source_id, title, body, content_type, source_url, author,
                                    created_at, updated_at, metadata_json, content_hash)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        )?
        .execute(params![
            doc.id,
            doc.source,
            doc.source_id,
            doc.title,
            doc.body,
            doc.content_type,
            doc.source_url,
            doc.author,
            doc.created_at,
            doc.updated_at,
            doc.metadata_json,
            doc.content_hash
        ])?;
        let mut insert = tx.prepare_cached(
            "INSERT INTO chunks (id, document_id, idx, text, tokens, title, source, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        let mut index = tx.prepare_cached("INSERT INTO chunks_fts (rowid, text, title) VALUES (?1, ?2, ?3)")?;
        for (id, idx, text, tokens) in &doc.chunks {
            insert.execute(params![id, doc.id, idx, text, tokens, doc.title, doc.source, doc.updated_at])?;
            index.execute(params![id, text, doc.title])?;
        }
    }
    let mut models = std::collections::HashMap::new();
    for (chunk, model, dims, blob) in &batch.vectors {
        let id = match models.get(&(model.as_str(), *dims)) {
            Some(id) => *id,
            None => {
                let id = vectors::model_id(&tx, model, *dims as usize)?;
                models.insert((model.as_str(), *dims), id);
                id
            }
        };
        // A chunk replaced since (its document changed in a later generation) has none.
        tx.prepare_cached(
            "INSERT INTO chunk_vectors (chunk_id, model_id, vector) SELECT ?1, ?2, ?3
             WHERE EXISTS (SELECT 1 FROM chunks WHERE id = ?1)
             ON CONFLICT (chunk_id) DO UPDATE SET model_id = excluded.model_id, vector = excluded.vector",
        )?
        .execute(params![chunk, id, blob])?;
    }
    // The sources' records are few: replaced whole, so a removed source goes too.
    tx.execute("DELETE FROM sync_state", [])?;
    for (source, last_sync, last_error, syncs, failures, took) in &batch.sync_state {
        tx.prepare_cached(
            "INSERT INTO sync_state (source, last_sync, last_error, syncs, failures, last_duration_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![source, last_sync, last_error, syncs, failures, took])?;
    }
    tx.execute("DELETE FROM connector_state", [])?;
    for (source, last_success, state) in &batch.connector_state {
        tx.prepare_cached("INSERT INTO connector_state (source, last_success, state_json) VALUES (?1, ?2, ?3)")?
            .execute(params![source, last_success, state])?;
    }
    // Readers' caches follow these counters: the keyword lists `generation`, the vector index
    // both.
    if batch.full || !batch.documents.is_empty() || !batch.deleted.is_empty() {
        tx.execute("UPDATE store_meta SET value = value + 1 WHERE key = 'generation'", [])?;
    }
    if !batch.vectors.is_empty() {
        tx.execute("UPDATE store_meta SET value = value + 1 WHERE key = 'vector_generation'", [])?;
    }
    for (key, value) in [(SOURCE_KEY, instance), (GENERATION_KEY, batch.generation)] {
        tx.execute(
            "INSERT INTO store_meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![key, value],
        )?;
    }
    tx.commit()?;
    Ok(())
}
