//! Chunk vectors: stored beside the chunks in SQLite, searched from a contiguous copy in memory.
//!
//! Each chunk has at most one vector, tagged with the model that made it (`embedding_models`:
//! name and dimensions). Vectors are written by the same transaction as their chunk, and go
//! with it (`ON DELETE CASCADE`), so a sync killed at any point leaves chunks and vectors
//! consistent. Semantic search scans every vector of the current model that passes the
//! filters, in one tight loop over a flat array of 8-bit copies (a quarter of the memory and
//! the bandwidth of `f32`, each row with its own scale), keeps a few times k of the best, and
//! ranks those again by their exact `f32` vectors from SQLite: the top k and its scores are
//! the exact ones unless the 8-bit error reorders rows across that margin. Filters apply
//! before the cut. Large indexes are scanned on every core. The array is rebuilt when the
//! store's generation or its vector-only counter changes (every write bumps one; the keyword
//! lists of `term_rank` follow the first only): at once while it is small, and beside the
//! queries once it is large (a million vectors take seconds to read), which keep using the last
//! copy meanwhile. A stale copy never returns a deleted chunk (candidates and their exact
//! vectors are read from the database); it can miss the chunks of the last few seconds' writes.

use std::collections::{BinaryHeap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use rusqlite::{params, Connection, OptionalExtension};

use super::store::SearchFilter;

/// The tables, created by the store's fourth migration.
pub(super) const DDL: &str = r#"
CREATE TABLE embedding_models (
    id   INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    dims INTEGER NOT NULL
);
CREATE TABLE chunk_vectors (
    chunk_id INTEGER PRIMARY KEY REFERENCES chunks(id) ON DELETE CASCADE,
    model_id INTEGER NOT NULL REFERENCES embedding_models(id),
    vector   BLOB NOT NULL
);
CREATE INDEX chunk_vectors_model ON chunk_vectors (model_id);
"#;

/// A vector as stored: little-endian `f32`s.
pub fn to_blob(vector: &[f32]) -> Vec<u8> {
    vector.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A stored vector back; `None` if the blob is not `dims` floats.
pub fn from_blob(blob: &[u8], dims: usize) -> Option<Vec<f32>> {
    (blob.len() == dims * 4)
        .then(|| blob.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

/// The id of model `name` with `dims` dimensions, created if new. A name stored with other
/// dimensions is a different model: its old row is renamed away with its vectors kept until
/// they are replaced.
pub fn model_id(tx: &Connection, name: &str, dims: usize) -> rusqlite::Result<i64> {
    let found: Option<(i64, i64)> = tx
        .prepare_cached("SELECT id, dims FROM embedding_models WHERE name = ?1")?
        .query_row([name], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match found {
        Some((id, stored)) if stored as usize == dims => Ok(id),
        Some((id, stored)) => {
            tx.prepare_cached("UPDATE embedding_models SET name = ?1 WHERE id = ?2")?
                .execute(params![format!("{name} ({stored} dims, replaced)"), id])?;
            model_id(tx, name, dims)
        }
        None => {
            tx.prepare_cached("INSERT INTO embedding_models (name, dims) VALUES (?1, ?2)")?
                .execute(params![name, dims as i64])?;
            Ok(tx.last_insert_rowid())
        }
    }
}

/// Writes (or replaces) the vector of chunk `chunk_id`, if the chunk still exists. A vector
/// whose length is not the model's is refused: it would be skipped by every search.
pub fn put(tx: &Connection, chunk_id: i64, model_id: i64, vector: &[f32]) -> rusqlite::Result<()> {
    let dims: i64 =
        tx.prepare_cached("SELECT dims FROM embedding_models WHERE id = ?1")?.query_row([model_id], |r| r.get(0))?;
    if dims as usize != vector.len() {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "a vector of {} dimensions for a model of {dims}",
            vector.len()
        )));
    }
    tx.prepare_cached(
        "INSERT INTO chunk_vectors (chunk_id, model_id, vector) SELECT ?1, ?2, ?3 WHERE EXISTS (SELECT 1 FROM chunks WHERE id = ?1)
         ON CONFLICT (chunk_id) DO UPDATE SET model_id = excluded.model_id, vector = excluded.vector",
    )?
    .execute(params![chunk_id, model_id, to_blob(vector)])?;
    Ok(())
}

/// What is embedded for a chunk: its document's title, then its text. The title says what a
/// chunk is about when its own words don't.
pub fn embed_text(title: &str, text: &str) -> String {
    if title.is_empty() {
        text.to_string()
    } else {
        format!("{title}\n\n{text}")
    }
}

/// How many chunks have a vector of each model, and how many chunks there are.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Coverage {
    pub chunks: i64,
    /// `(model name, dims, chunks)`, most chunks first.
    pub models: Vec<(String, i64, i64)>,
}

impl Coverage {
    /// Chunks with a vector of model `name` with `dims` dimensions.
    pub fn of(&self, name: &str, dims: usize) -> i64 {
        self.models.iter().find(|m| m.0 == name && m.1 == dims as i64).map(|m| m.2).unwrap_or(0)
    }
}

pub fn coverage(conn: &Connection) -> rusqlite::Result<Coverage> {
    let chunks = conn.query_row("SELECT COUNT(*) FROM chunks", [], |r| r.get(0))?;
    let mut stmt = conn.prepare_cached(
        "SELECT m.name, m.dims, COUNT(v.chunk_id) AS n FROM embedding_models m
         JOIN chunk_vectors v ON v.model_id = m.id GROUP BY m.id ORDER BY n DESC, m.name",
    )?;
    let models = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect::<Result<_, _>>()?;
    Ok(Coverage { chunks, models })
}

/// How much of the index a semantic search saw: chunks with a vector of its model, and all.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Indexed {
    pub vectors: usize,
    pub chunks: usize,
}

/// Every vector of one model, flat, with what the filters need.
struct Loaded {
    generation: i64,
    /// Every chunk of the index, with a vector or not.
    chunks: usize,
    model: String,
    dims: usize,
    ids: Vec<i64>,
    /// Index into `sources` per row.
    source: Vec<u32>,
    sources: Vec<String>,
    /// `updated_at` per row (RFC 3339 UTC, so text order is time order).
    updated: Vec<Arc<str>>,
    /// `dims` 8-bit values per row: the vector divided by its row's scale.
    quant: Vec<i8>,
    scales: Vec<f32>,
}

/// Rows ranked by the 8-bit scan per row finally returned, at least: the margin for its error.
const OVERSAMPLE: usize = 4;
const OVERSAMPLE_MIN: usize = 64;

/// Rows per thread below which a scan stays on the calling thread.
const ROWS_PER_THREAD: usize = 50_000;

/// `v` as 8-bit values and the scale that gives them back (`v[i] ≈ q[i] * scale`).
fn quantize(v: &[f32], out: &mut Vec<i8>) -> f32 {
    let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    if max == 0.0 || !max.is_finite() {
        out.extend(std::iter::repeat_n(0i8, v.len()));
        return 0.0;
    }
    let scale = max / 127.0;
    out.extend(v.iter().map(|x| (x / scale).round().clamp(-127.0, 127.0) as i8));
    scale
}

/// Loaded copies with at least this many rows are rebuilt in the background.
const BACKGROUND_ROWS: usize = 200_000;

/// The in-memory copy of the vectors, shared by the store's connections.
pub struct VectorIndex {
    path: PathBuf,
    loaded: Arc<RwLock<Option<Arc<Loaded>>>>,
    /// A background rebuild is running.
    rebuilding: Arc<AtomicBool>,
    /// Held by the query that rebuilds a small copy, so the others wait for it instead of
    /// each reading every vector again.
    rebuild: std::sync::Mutex<()>,
    background_rows: usize,
}

impl VectorIndex {
    /// The `limit` chunks whose vectors of model `model` are closest to `query` (cosine; both
    /// are unit vectors), among those `filter` lets through: `(chunk id, similarity)`, best
    /// first, ties by id; and (chunks with a vector of that model, all chunks).
    pub fn top(
        &self,
        conn: &Connection,
        model: &str,
        query: &[f32],
        filter: &SearchFilter,
        limit: usize,
    ) -> rusqlite::Result<(Vec<(i64, f64)>, Indexed)> {
        let loaded = self.current(conn, model, query.len())?;
        let indexed = Indexed { vectors: loaded.ids.len(), chunks: loaded.chunks };
        let rough = scan(&loaded, query, filter, limit.saturating_mul(OVERSAMPLE).max(OVERSAMPLE_MIN));
        Ok((rescore(conn, &rough, query, limit)?, indexed))
    }

    /// The index of the database at `path` (the store's own file).
    pub fn new(path: &Path) -> VectorIndex {
        VectorIndex {
            path: path.to_path_buf(),
            loaded: Arc::default(),
            rebuilding: Arc::default(),
            rebuild: std::sync::Mutex::new(()),
            background_rows: BACKGROUND_ROWS,
        }
    }

    /// The copy to scan: the loaded one if it is current; else a fresh one, or, for a large
    /// index, the loaded one while a fresh one is built beside.
    fn current(&self, conn: &Connection, model: &str, dims: usize) -> rusqlite::Result<Arc<Loaded>> {
        let generation = generation(conn)?;
        let cached = self.loaded.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(cached) = cached.filter(|c| c.model == model && c.dims == dims) {
            if cached.generation == generation {
                return Ok(cached);
            }
            if cached.ids.len() >= self.background_rows {
                self.rebuild_beside(model, dims);
                return Ok(cached);
            }
        }
        let _one_at_a_time = self.rebuild.lock().unwrap_or_else(|p| p.into_inner());
        // Another query may have rebuilt it while this one waited.
        let cached = self.loaded.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(cached) = cached.filter(|c| c.model == model && c.dims == dims && c.generation >= generation) {
            return Ok(cached);
        }
        conn.prepare_cached("BEGIN")?.execute([])?;
        let fresh = load(conn, model, dims);
        let end = conn.prepare_cached("COMMIT").and_then(|mut s| s.execute([]));
        let fresh = Arc::new(fresh?);
        end?;
        *self.loaded.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&fresh));
        Ok(fresh)
    }

    /// Starts one background rebuild, on its own connection, unless one is running.
    fn rebuild_beside(&self, model: &str, dims: usize) {
        if self.rebuilding.swap(true, Ordering::AcqRel) {
            return;
        }
        let (path, loaded, rebuilding, model) =
            (self.path.clone(), Arc::clone(&self.loaded), Arc::clone(&self.rebuilding), model.to_string());
        std::thread::spawn(move || {
            let fresh = super::pool::open(&path).map_err(|e| e.to_string()).and_then(|conn| {
                conn.execute_batch("BEGIN").map_err(|e| e.to_string())?;
                let fresh = load(&conn, &model, dims).map_err(|e| e.to_string());
                let _ = conn.execute_batch("COMMIT");
                fresh
            });
            match fresh {
                Ok(fresh) => *loaded.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(fresh)),
                Err(e) => tracing::warn!("rebuilding the vector index failed (the last copy stays in use): {e}"),
            }
            rebuilding.store(false, Ordering::Release);
        });
    }
}

/// What the vectors depend on: the store's write counter plus its vector-only one (both only
/// grow, so their sum changes with either and never repeats).
fn generation(conn: &Connection) -> rusqlite::Result<i64> {
    Ok(conn
        .prepare_cached(
            "SELECT COALESCE(SUM(value), 0) FROM store_meta WHERE key IN ('generation', 'vector_generation')",
        )?
        .query_row([], |r| r.get(0))
        .optional()?
        .unwrap_or(0))
}

/// Every vector of `model` with `dims` dimensions, read inside the caller's transaction.
fn load(conn: &Connection, model: &str, dims: usize) -> rusqlite::Result<Loaded> {
    let generation = generation(conn)?;
    // A model with no vectors yet has no row: it finds nothing.
    let id = conn
        .prepare_cached("SELECT id FROM embedding_models WHERE name = ?1 AND dims = ?2")?
        .query_row(params![model, dims as i64], |r| r.get::<_, i64>(0))
        .optional()?
        .unwrap_or(-1);
    let chunks: i64 = conn.prepare_cached("SELECT COUNT(*) FROM chunks")?.query_row([], |r| r.get(0))?;
    let mut fresh = Loaded {
        generation,
        chunks: chunks as usize,
        model: model.to_string(),
        dims,
        ids: Vec::new(),
        source: Vec::new(),
        sources: Vec::new(),
        updated: Vec::new(),
        quant: Vec::new(),
        scales: Vec::new(),
    };
    let mut source_index: HashMap<String, u32> = HashMap::new();
    let mut dates: HashMap<String, Arc<str>> = HashMap::new();
    let mut stmt = conn.prepare_cached(
        "SELECT v.chunk_id, v.vector, c.source, c.updated_at FROM chunk_vectors v JOIN chunks c ON c.id = v.chunk_id
         WHERE v.model_id = ?1 ORDER BY v.chunk_id",
    )?;
    let mut rows = stmt.query([id])?;
    while let Some(row) = rows.next()? {
        let blob = row.get_ref(1)?.as_blob()?;
        if blob.len() != dims * 4 {
            continue;
        }
        fresh.ids.push(row.get(0)?);
        let vector: Vec<f32> = blob.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let scale = quantize(&vector, &mut fresh.quant);
        fresh.scales.push(scale);
        let source: String = row.get(2)?;
        let next = source_index.len() as u32;
        let at = *source_index.entry(source.clone()).or_insert_with(|| {
            fresh.sources.push(source);
            next
        });
        fresh.source.push(at);
        let updated: String = row.get(3)?;
        let shared = dates.entry(updated.clone()).or_insert_with(|| Arc::from(updated.as_str()));
        fresh.updated.push(Arc::clone(shared));
    }
    Ok(fresh)
}

/// A row and its similarity, ordered so that a max-heap keeps the worst on top.
#[derive(PartialEq)]
struct Scored(f32, i64);

impl Eq for Scored {}

impl PartialOrd for Scored {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scored {
    // "Greater" is worse: lower similarity, then the higher id.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.0.total_cmp(&self.0).then(self.1.cmp(&other.1))
    }
}

/// The top `limit` rows of `loaded` for `query` under `filter`, by the 8-bit copies: `(chunk
/// id, approximate similarity)`, best first, ties by id. Large indexes are split across cores.
fn scan(loaded: &Loaded, query: &[f32], filter: &SearchFilter, limit: usize) -> Vec<(i64, f64)> {
    if limit == 0 || loaded.ids.is_empty() {
        return Vec::new();
    }
    let mut q = Vec::with_capacity(query.len());
    let q_scale = quantize(query, &mut q);
    let allowed: Option<Vec<bool>> =
        filter.sources.as_ref().map(|wanted| loaded.sources.iter().map(|s| wanted.contains(s)).collect());
    let pass = Pass { loaded, q: &q, q_scale, allowed: allowed.as_deref(), since: filter.since.as_deref(), limit };
    let rows = loaded.ids.len();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(rows / ROWS_PER_THREAD).max(1);
    let heap = if threads == 1 {
        pass.rows(0..rows)
    } else {
        let per = rows.div_ceil(threads);
        std::thread::scope(|scope| {
            let parts: Vec<_> = (0..threads)
                .map(|t| {
                    let pass = &pass;
                    scope.spawn(move || pass.rows(t * per..((t + 1) * per).min(rows)))
                })
                .collect();
            let mut merged = BinaryHeap::with_capacity(limit + 1);
            for part in parts {
                for candidate in part.join().unwrap_or_default() {
                    keep(&mut merged, candidate, limit);
                }
            }
            merged
        })
    };
    let mut top = heap.into_vec();
    top.sort();
    top.into_iter().map(|Scored(s, id)| (id, s as f64)).collect()
}

/// One scan's inputs.
struct Pass<'a> {
    loaded: &'a Loaded,
    q: &'a [i8],
    q_scale: f32,
    allowed: Option<&'a [bool]>,
    since: Option<&'a str>,
    limit: usize,
}

impl Pass<'_> {
    /// The best `limit` of rows `range`: the loop compiled for AVX2 where the CPU has it (the
    /// dot products then take 32 bytes a step instead of 16), else for the baseline.
    fn rows(&self, range: std::ops::Range<usize>) -> BinaryHeap<Scored> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above; the function is plain Rust.
            return unsafe { self.rows_avx2(range) };
        }
        self.rows_portable(range)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn rows_avx2(&self, range: std::ops::Range<usize>) -> BinaryHeap<Scored> {
        self.rows_portable(range)
    }

    #[inline(always)]
    fn rows_portable(&self, range: std::ops::Range<usize>) -> BinaryHeap<Scored> {
        let (loaded, dims) = (self.loaded, self.loaded.dims);
        let mut heap = BinaryHeap::with_capacity(self.limit + 1);
        for row in range {
            if let Some(allowed) = self.allowed {
                if !allowed[loaded.source[row] as usize] {
                    continue;
                }
            }
            if let Some(since) = self.since {
                if &*loaded.updated[row] < since {
                    continue;
                }
            }
            let values = &loaded.quant[row * dims..(row + 1) * dims];
            let similarity = dot_i8(values, self.q) as f32 * loaded.scales[row] * self.q_scale;
            keep(&mut heap, Scored(similarity, loaded.ids[row]), self.limit);
        }
        heap
    }
}

/// Adds `candidate` to a heap of the best `limit`.
fn keep(heap: &mut BinaryHeap<Scored>, candidate: Scored, limit: usize) {
    if heap.len() < limit {
        heap.push(candidate);
    } else if heap.peek().is_some_and(|worst| candidate < *worst) {
        heap.pop();
        heap.push(candidate);
    }
}

/// The exact similarities of `rough`'s rows, from their stored `f32` vectors: the best
/// `limit`, best first, ties by id.
fn rescore(conn: &Connection, rough: &[(i64, f64)], query: &[f32], limit: usize) -> rusqlite::Result<Vec<(i64, f64)>> {
    if rough.is_empty() {
        return Ok(Vec::new());
    }
    let ids = serde_json::to_string(&rough.iter().map(|r| r.0).collect::<Vec<_>>()).unwrap_or_default();
    let mut stmt = conn.prepare_cached(
        "SELECT chunk_id, vector FROM chunk_vectors WHERE chunk_id IN (SELECT value FROM json_each(?1))",
    )?;
    let mut rows = stmt.query([ids])?;
    let mut exact: Vec<Scored> = Vec::with_capacity(rough.len());
    while let Some(row) = rows.next()? {
        let blob = row.get_ref(1)?.as_blob()?;
        if let Some(vector) = from_blob(blob, query.len()) {
            exact.push(Scored(dot(&vector, query), row.get(0)?));
        }
    }
    exact.sort();
    exact.truncate(limit);
    Ok(exact.into_iter().map(|Scored(s, id)| (id, s as f64)).collect())
}

/// The dot product of two 8-bit vectors, in 32 independent sums that the compiler keeps in
/// vector registers (widening multiply-adds).
#[inline(always)]
fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    let mut sums = [0i32; 32];
    let (a32, b32) = (a.chunks_exact(32), b.chunks_exact(32));
    let tail: i32 = a32.remainder().iter().zip(b32.remainder()).map(|(&x, &y)| x as i32 * y as i32).sum();
    for (x, y) in a32.zip(b32) {
        for i in 0..32 {
            sums[i] += x[i] as i32 * y[i] as i32;
        }
    }
    sums.iter().sum::<i32>() + tail
}

/// The dot product, in eight independent sums so the compiler keeps them in vector registers.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut sums = [0.0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (a8.remainder(), b8.remainder());
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            sums[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    sums.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store whose chunk `i` (of `n`) has a vector along axis `i % 2`.
    fn store_with(dir: &Path, n: usize) -> crate::kb::SqliteStore {
        use crate::kb::store::{Change, DocVectors, NewDocument, Store};
        let store = crate::kb::SqliteStore::open(&dir.join("kb.sqlite"), crate::kb::store::Stemming::English).unwrap();
        let changes: Vec<Change> = (0..n)
            .map(|i| {
                Change::Upsert(Box::new(NewDocument {
                    id: format!("d{i}"),
                    source: "filesystem:docs".into(),
                    source_id: format!("d{i}"),
                    title: format!("D{i}"),
                    body: "x".into(),
                    content_type: "text/plain".into(),
                    source_url: None,
                    author: None,
                    created_at: "2026-01-01T00:00:00Z".into(),
                    updated_at: "2026-01-01T00:00:00Z".into(),
                    metadata: serde_json::Value::Null,
                    content_hash: format!("{i}"),
                    chunks: vec![crate::kb::chunk::Chunk { index: 0, text: format!("chunk {i}"), tokens: 2 }],
                    vectors: Some(DocVectors {
                        model: "m".into(),
                        dims: 2,
                        rows: vec![if i % 2 == 0 { vec![1.0, 0.0] } else { vec![0.0, 1.0] }],
                    }),
                }))
            })
            .collect();
        store.apply(&changes).unwrap();
        store
    }

    #[test]
    fn a_large_index_answers_from_its_last_copy_while_a_fresh_one_is_built() {
        use crate::kb::store::Store;
        let dir = tempfile::tempdir().unwrap();
        let store = store_with(dir.path(), 4);
        let conn = super::super::pool::open(&dir.path().join("kb.sqlite")).unwrap();
        let mut index = VectorIndex::new(&dir.path().join("kb.sqlite"));
        index.background_rows = 1;
        let filter = SearchFilter::default();
        let (first, seen) = index.top(&conn, "m", &[1.0, 0.0], &filter, 10).unwrap();
        assert_eq!(seen.vectors, 4);
        assert_eq!(first.len(), 4);
        // A write: the next query still answers (from the old copy), and a rebuild starts.
        let chunk: i64 = conn.query_row("SELECT id FROM chunks ORDER BY id DESC LIMIT 1", [], |r| r.get(0)).unwrap();
        store.put_vectors("m", 2, &[(chunk, vec![1.0, 0.0])]).unwrap();
        let (_, during) = index.top(&conn, "m", &[1.0, 0.0], &filter, 10).unwrap();
        assert_eq!(during.vectors, 4);
        let started = std::time::Instant::now();
        loop {
            let fresh = index.loaded.read().unwrap().as_ref().map(|l| l.generation).unwrap_or(0);
            if fresh == generation(&conn).unwrap() {
                break;
            }
            assert!(started.elapsed() < std::time::Duration::from_secs(10), "the rebuild finished");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // Now the changed vector counts: chunk `chunk` points along the query.
        let (after, _) = index.top(&conn, "m", &[1.0, 0.0], &filter, 10).unwrap();
        let top_ids: Vec<i64> = after.iter().filter(|r| r.1 > 0.9).map(|r| r.0).collect();
        assert!(top_ids.contains(&chunk), "{after:?}");
        // A small index is rebuilt at once.
        index.background_rows = usize::MAX;
        store.put_vectors("m", 2, &[(chunk, vec![0.0, 1.0])]).unwrap();
        let (now, _) = index.top(&conn, "m", &[1.0, 0.0], &filter, 10).unwrap();
        assert!(!now.iter().filter(|r| r.1 > 0.9).any(|r| r.0 == chunk), "{now:?}");
    }

    #[test]
    fn blobs_round_trip() {
        let v = vec![0.5f32, -1.25, 3.0];
        assert_eq!(from_blob(&to_blob(&v), 3), Some(v));
        assert_eq!(from_blob(&[0u8; 7], 2), None);
    }

    #[test]
    fn quantized_dot_products_stay_close() {
        let a: Vec<f32> = (0..256).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
        let b: Vec<f32> = (0..256).map(|i| ((i * 53 % 89) as f32 - 44.0) / 44.0).collect();
        let (mut qa, mut qb) = (Vec::new(), Vec::new());
        let (sa, sb) = (quantize(&a, &mut qa), quantize(&b, &mut qb));
        let rough = dot_i8(&qa, &qb) as f32 * sa * sb;
        let exact = dot(&a, &b);
        assert!((rough - exact).abs() < 0.01 * a.len() as f32 / 10.0, "{rough} vs {exact}");
        assert_eq!(quantize(&[0.0, 0.0], &mut Vec::new()), 0.0);
    }

    #[test]
    fn dot_matches_the_plain_sum() {
        let a: Vec<f32> = (0..19).map(|i| i as f32 * 0.1).collect();
        let b: Vec<f32> = (0..19).map(|i| 1.0 - i as f32 * 0.05).collect();
        let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - plain).abs() < 1e-4);
    }

    #[test]
    fn scan_keeps_the_best_and_filters_first() {
        let loaded = Loaded {
            generation: 0,
            chunks: 4,
            model: "m".into(),
            dims: 2,
            ids: vec![1, 2, 3, 4],
            source: vec![0, 0, 1, 1],
            sources: vec!["a".into(), "b".into()],
            updated: ["2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z"]
                .iter()
                .map(|d| Arc::from(*d))
                .collect(),
            quant: Vec::new(),
            scales: Vec::new(),
        };
        let mut loaded = loaded;
        for row in [[1.0f32, 0.0], [0.8, 0.6], [0.0, 1.0], [0.8, 0.6]] {
            let scale = quantize(&row, &mut loaded.quant);
            loaded.scales.push(scale);
        }
        let q = [1.0, 0.0];
        let ids = |top: Vec<(i64, f64)>| top.into_iter().map(|t| t.0).collect::<Vec<_>>();
        // 2 and 4 tie at 0.8: the lower id first.
        assert_eq!(ids(scan(&loaded, &q, &SearchFilter::default(), 3)), vec![1, 2, 4]);
        let only_b = SearchFilter { sources: Some(vec!["b".into()]), since: None };
        assert_eq!(ids(scan(&loaded, &q, &only_b, 3)), vec![4, 3]);
        let recent = SearchFilter { sources: None, since: Some("2026-02-15T00:00:00Z".into()) };
        assert_eq!(ids(scan(&loaded, &q, &recent, 1)), vec![4]);
    }
}
