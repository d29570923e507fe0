//! Vectors for sync: each batch's new chunks are embedded before the batch is written, so the
//! batch's one transaction holds chunks and vectors together; chunks whose text did not change
//! keep their vectors; a backfill embeds whatever still has none (an index synced before a
//! model was configured, a model change, a batch whose provider failed).

use std::collections::HashMap;

use super::store::{Change, DocVectors, Store};
use super::vectors::embed_text;
use super::KbError;
use crate::embed::{EmbedError, Embedder};

/// Chunks per backfill transaction.
const BACKFILL_BATCH: usize = 512;

/// Local models embed this many texts per thread at least; fewer are not worth a thread.
const PER_THREAD: usize = 64;

/// Gives every upserted document of `batch` its vectors: reused for chunk texts its stored
/// version already embedded, computed for the rest. Returns how many texts were embedded.
pub fn attach(store: &dyn Store, embedder: &dyn Embedder, batch: &mut [Change]) -> Result<usize, KbError> {
    let ids: Vec<&str> = batch
        .iter()
        .filter_map(|c| match c {
            Change::Upsert(doc) => Some(doc.id.as_str()),
            _ => None,
        })
        .collect();
    if ids.is_empty() {
        return Ok(0);
    }
    let reuse = store.vectors_to_reuse(&ids, embedder.name(), embedder.dims())?;
    // Every text to embed, once, in order of first use.
    let mut wanted: HashMap<String, usize> = HashMap::new();
    let mut texts: Vec<String> = Vec::new();
    for change in batch.iter() {
        let Change::Upsert(doc) = change else { continue };
        for chunk in &doc.chunks {
            let text = embed_text(&doc.title, &chunk.text);
            if !reuse.contains_key(&text) && !wanted.contains_key(&text) {
                wanted.insert(text.clone(), texts.len());
                texts.push(text);
            }
        }
    }
    let fresh = embed_all(embedder, &texts).map_err(|e| KbError::Embed(e.to_string()))?;
    for change in batch.iter_mut() {
        let Change::Upsert(doc) = change else { continue };
        let rows = doc
            .chunks
            .iter()
            .map(|chunk| {
                let text = embed_text(&doc.title, &chunk.text);
                reuse.get(&text).cloned().unwrap_or_else(|| fresh[wanted[&text]].clone())
            })
            .collect();
        doc.vectors = Some(DocVectors { model: embedder.name().to_string(), dims: embedder.dims(), rows });
    }
    Ok(texts.len())
}

/// What a backfill did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Backfill {
    /// Chunks that got a vector.
    pub embedded: usize,
    /// Models whose vectors the index held before and the configured one replaces.
    pub replaced: Vec<String>,
}

/// Chunks still without a vector of `embedder`'s model, before a backfill: how many, and which
/// other models the index has vectors of.
pub fn pending(store: &dyn Store, embedder: &dyn Embedder) -> Result<(usize, Vec<String>), KbError> {
    let coverage = store.coverage()?;
    let (name, dims) = (embedder.name(), embedder.dims());
    let missing = (coverage.chunks - coverage.of(name, dims)).max(0) as usize;
    let others = coverage
        .models
        .iter()
        .filter(|m| m.0 != name || m.1 != dims as i64)
        .map(|m| format!("{} ({} dims)", m.0, m.1))
        .collect();
    Ok((missing, others))
}

/// Embeds every chunk that has no vector of `embedder`'s model, a transaction per batch (a
/// backfill stopped half-way keeps what it wrote, and the next one goes on from there).
/// `progress` gets (done, total).
pub fn backfill(
    store: &dyn Store,
    embedder: &dyn Embedder,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Backfill, KbError> {
    let (total, replaced) = pending(store, embedder)?;
    let mut done = 0;
    let (name, dims) = (embedder.name(), embedder.dims());
    // Each round takes the next chunks, by id, that have no vector of this model yet; a chunk
    // deleted meanwhile is skipped by the write. Chunks added behind the cursor while this runs
    // are the next sync's.
    let mut after = 0i64;
    loop {
        let rows = store.unembedded(name, dims, after, BACKFILL_BATCH)?;
        let Some(last) = rows.last() else { break };
        after = last.0;
        let texts: Vec<String> = rows.iter().map(|r| r.1.clone()).collect();
        let vectors = embed_all(embedder, &texts).map_err(|e| KbError::Embed(e.to_string()))?;
        let written: Vec<(i64, Vec<f32>)> = rows.iter().map(|r| r.0).zip(vectors).collect();
        store.put_vectors(name, dims, &written)?;
        done += written.len();
        progress(done.min(total.max(done)), total.max(done));
    }
    Ok(Backfill { embedded: done, replaced })
}

/// Embeds `texts`; a local model on every core, a service in the provider's own batches.
pub fn embed_all(embedder: &dyn Embedder, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    if embedder.remote() || embedder.parallel_inside() || threads < 2 || texts.len() < PER_THREAD * 2 {
        return embedder.embed(&refs);
    }
    let per = texts.len().div_ceil(threads.min(texts.len() / PER_THREAD).max(1));
    let parts: Vec<Result<Vec<Vec<f32>>, EmbedError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = refs.chunks(per).map(|part| scope.spawn(move || embedder.embed(part))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(EmbedError::Config("an embedding thread panicked".to_string()))))
            .collect()
    });
    let mut out = Vec::with_capacity(texts.len());
    for part in parts {
        out.extend(part?);
    }
    Ok(out)
}
