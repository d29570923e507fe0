//! The `Store` trait and its SQLite implementation: documents, chunks, the FTS5 index, sync state.
//!
//! Everything else in the knowledge base talks to the trait, so another backend (PostgreSQL)
//! can be added later without touching sync or search.

use std::collections::HashMap;
use std::path::Path;

use rusqlite::{params, OptionalExtension};
use serde_json::Value;

use super::chunk::Chunk;
use super::pool::{self, Pool, Pooled};
use super::term_rank::{self, IndexPhrase, TermRanker};
use super::topk;
use super::vectors::{self, VectorIndex};
use super::KbError;
use crate::types;

/// A document ready to be written, with its chunks.
#[derive(Clone, Debug, PartialEq)]
pub struct NewDocument {
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
    pub metadata: Value,
    pub content_hash: String,
    pub chunks: Vec<Chunk>,
    /// One vector per chunk, in order, when an embedding model is configured.
    pub vectors: Option<DocVectors>,
}

/// The vectors of a document's chunks, and the model that made them.
#[derive(Clone, Debug, PartialEq)]
pub struct DocVectors {
    pub model: String,
    pub dims: usize,
    pub rows: Vec<Vec<f32>>,
}

/// One write of a sync batch.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Upsert(Box<NewDocument>),
    Delete {
        source: String,
        source_id: String,
    },
    /// A script source synced successfully: when it started, and its connector's new state
    /// (`None`: unchanged). See [`super::connector_state`].
    SourceSynced {
        source: String,
        started_at: String,
        state: Option<serde_json::Map<String, Value>>,
    },
}

/// Restrictions applied inside the query, before the top-k cut.
#[derive(Clone, Debug, Default)]
pub struct SearchFilter {
    /// Exact source names (`type:name`); `None` searches every source.
    pub sources: Option<Vec<String>>,
    /// RFC 3339 lower bound on `updated_at`.
    pub since: Option<String>,
}

/// A ranked chunk, before grouping by document.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub chunk_id: i64,
    pub document_id: String,
    pub chunk_index: i64,
    /// Higher is better: the negated BM25 rank.
    pub score: f64,
    pub title: String,
    pub source: String,
    pub source_url: Option<String>,
    pub updated_at: String,
    /// The document's id within its source (a relative path for files).
    pub source_id: String,
}

/// Indexed counts and last sync of one source.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceRow {
    pub source: String,
    pub documents: i64,
    pub chunks: i64,
    pub last_sync: Option<String>,
    pub last_error: Option<String>,
    /// Syncs recorded, failed ones among them, and how long the last one took.
    pub syncs: i64,
    pub failures: i64,
    pub last_duration_ms: Option<i64>,
}

/// Database-wide counts for `ctx stats`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Stats {
    pub documents: i64,
    pub chunks: i64,
    pub sources: i64,
    pub database_bytes: u64,
    pub schema_version: i64,
    /// Chunks with a vector, per embedding model.
    pub vectors: Vec<ModelVectors>,
}

/// How many chunks have a vector of one model.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ModelVectors {
    pub model: String,
    pub dims: i64,
    pub chunks: i64,
}

/// Storage for the knowledge base.
pub trait Store: Send + Sync {
    /// `source_id -> content_hash` of every document of `source`.
    fn known_hashes(&self, source: &str) -> Result<HashMap<String, String>, KbError>;
    /// Applies the changes in one transaction: all or nothing.
    fn apply(&self, changes: &[Change]) -> Result<(), KbError>;
    /// Opens one transaction for many [`Writes::apply`] calls: they all land at
    /// [`Writes::commit`], or none of them do if the session is dropped first.
    fn begin(&self) -> Result<Box<dyn Writes + '_>, KbError>;
    /// Records the end of a sync of `source`.
    fn record_sync(&self, source: &str, error: Option<&str>, took: std::time::Duration) -> Result<(), KbError>;
    /// What the last successful sync of a script source left for the next one.
    fn connector_state(&self, source: &str) -> Result<super::connector_state::Saved, KbError>;
    /// The form the keyword index stores `word` (lower-case) in: its stem when the index stems.
    fn stem(&self, word: &str) -> Result<String, KbError>;
    /// What a prefix query for `prefix` (lower-case) searches: its longest start the index's
    /// stemmer keeps as it is, so that every stem of every word starting with `prefix` matches.
    fn prefix_root(&self, prefix: &str) -> Result<String, KbError>;
    /// Top `limit` chunks for an FTS5 MATCH expression, filters applied before the cut, best
    /// score first and ties by lower chunk id. Expressions of plain ASCII terms and term starts
    /// are ranked from cached posting lists (`term_rank`), anything else by FTS5's `bm25()`.
    fn keyword_candidates(
        &self,
        fts_query: &str,
        filter: &SearchFilter,
        limit: usize,
    ) -> Result<Vec<Candidate>, KbError>;
    /// [`Store::keyword_candidates`] with every match scored by FTS5's `bm25()`: the reference
    /// the posting lists must equal (tests and benches compare the two).
    fn keyword_candidates_by_fts5(
        &self,
        fts_query: &str,
        filter: &SearchFilter,
        limit: usize,
    ) -> Result<Vec<Candidate>, KbError>;
    /// Top `limit` chunks by cosine similarity of their `model` vectors to `query`, filters
    /// applied before the cut, and (chunks with such a vector, all chunks).
    fn semantic_candidates(
        &self,
        model: &str,
        query: &[f32],
        filter: &SearchFilter,
        limit: usize,
    ) -> Result<(Vec<Candidate>, vectors::Indexed), KbError>;
    /// The `model` vectors the chunks of these documents have now, by the text they embed
    /// ([`vectors::embed_text`]): a changed document keeps those of its unchanged chunks.
    fn vectors_to_reuse(
        &self,
        document_ids: &[&str],
        model: &str,
        dims: usize,
    ) -> Result<HashMap<String, Vec<f32>>, KbError>;
    /// Up to `limit` chunks after chunk id `after` without a `model` vector: `(chunk id, text to
    /// embed)`, by id.
    fn unembedded(&self, model: &str, dims: usize, after: i64, limit: usize) -> Result<Vec<(i64, String)>, KbError>;
    /// Writes `model` vectors of existing chunks in one transaction.
    fn put_vectors(&self, model: &str, dims: usize, rows: &[(i64, Vec<f32>)]) -> Result<(), KbError>;
    /// How many chunks have vectors, per model.
    fn coverage(&self) -> Result<vectors::Coverage, KbError>;
    /// The text of some chunks, by chunk id (for snippets).
    fn chunk_texts(&self, chunk_ids: &[i64]) -> Result<HashMap<i64, String>, KbError>;
    /// A whole document with its chunks.
    fn document(&self, id: &str) -> Result<Option<types::Document>, KbError>;
    /// Every source that has documents or a sync record, with counts (walks the tables).
    fn sources(&self) -> Result<Vec<SourceRow>, KbError>;
    /// Names of every source that was ever synced (cheap: one row per source).
    fn source_names(&self) -> Result<Vec<String>, KbError>;
    fn stats(&self) -> Result<Stats, KbError>;
    /// Deletes every document of `source` (with its chunks, index rows and vectors) and what
    /// the store remembers of its syncs, in one transaction: the source is whole or gone.
    fn remove_source(&self, source: &str) -> Result<Removed, KbError>;
    /// The right to sync `source`, held until the value is dropped: on a shared database one
    /// process syncs a source at a time, the others wait (up to `wait`) and then say who holds it.
    /// A SQLite file serializes its writers itself.
    fn claim_source(&self, _source: &str, _wait: std::time::Duration) -> Result<Claim, KbError> {
        Ok(Box::new(()))
    }
}

/// What [`Store::claim_source`] holds.
pub type Claim = Box<dyn std::any::Any + Send>;

/// What [`Store::remove_source`] deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Removed {
    pub documents: i64,
    pub chunks: i64,
}

/// A write session from [`Store::begin`]. It holds the database's write lock until it ends.
pub trait Writes {
    fn apply(&mut self, changes: &[Change]) -> Result<(), KbError>;
    fn commit(self: Box<Self>) -> Result<(), KbError>;
}

/// Schema migrations; `PRAGMA user_version` is the number applied.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE documents (
    id            TEXT PRIMARY KEY,
    source        TEXT NOT NULL,
    source_id     TEXT NOT NULL,
    title         TEXT NOT NULL,
    body          TEXT NOT NULL,
    content_type  TEXT NOT NULL,
    source_url    TEXT,
    author        TEXT,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    metadata_json TEXT NOT NULL DEFAULT 'null',
    content_hash  TEXT NOT NULL,
    UNIQUE (source, source_id)
);
-- Source and updated_at are copied onto chunks so that filters run inside the ranked query.
-- The FTS index is written by the store in one statement per batch, not by triggers: FTS5
-- flushes its pending terms at every statement savepoint, and a trigger per row made that a
-- flush per chunk.
CREATE TABLE chunks (
    id          INTEGER PRIMARY KEY,
    document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    idx         INTEGER NOT NULL,
    text        TEXT NOT NULL,
    tokens      INTEGER NOT NULL,
    title       TEXT NOT NULL,
    source      TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    UNIQUE (document_id, idx)
);
CREATE INDEX chunks_source ON chunks (source, updated_at);
CREATE VIRTUAL TABLE chunks_fts USING fts5(
    text, title, content = 'chunks', content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 2'
);
INSERT INTO chunks_fts (chunks_fts, rank) VALUES ('rank', 'bm25(1.0, 1.5)');
CREATE TABLE sync_state (
    source     TEXT PRIMARY KEY,
    last_sync  TEXT NOT NULL,
    last_error TEXT
);
"#,
    // A counter every write transaction bumps, so readers in any process can tell that what
    // they cached (the token counts of term_rank) is stale.
    r#"
CREATE TABLE store_meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
-- A random start, so a database deleted and created again under a running server does not
-- repeat a generation that server cached.
INSERT INTO store_meta (key, value) VALUES ('generation', abs(random() % 1000000000000));
"#,
    super::connector_state::DDL,
    super::vectors::DDL,
    // Whether the keyword index stores stems (see `Stemming`); every index built before this
    // migration stores words as written. `SqliteStore::open` rebuilds it to match the config.
    "INSERT INTO store_meta (key, value) VALUES ('stemming', 0);",
    // Sync counts and the last one's duration, for /metrics (a sync may run in another
    // process: the server reads them from here).
    "ALTER TABLE sync_state ADD COLUMN syncs INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE sync_state ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE sync_state ADD COLUMN last_duration_ms INTEGER;",
    // A counter of writes that add vectors and nothing else (an embedding backfill): the vector
    // index reloads on it, the keyword posting lists do not (`generation` counts every other
    // write, which both follow).
    "INSERT INTO store_meta (key, value) VALUES ('vector_generation', 0);",
];

/// How the keyword index tokenizes text: `[retrieval] stemming`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stemming {
    /// Words as written, case and accents folded.
    None,
    /// Porter stems of English words, on top of the same folding.
    English,
}

impl Stemming {
    /// The FTS5 `tokenize` option of the index.
    fn tokenizer(self) -> &'static str {
        match self {
            Stemming::None => "unicode61 remove_diacritics 2",
            Stemming::English => "porter unicode61 remove_diacritics 2",
        }
    }

    /// Its value in `store_meta`.
    fn code(self) -> i64 {
        match self {
            Stemming::None => 0,
            Stemming::English => 1,
        }
    }
}

/// The SQLite store.
pub struct SqliteStore {
    pool: Pool,
    terms: TermRanker,
    vectors: VectorIndex,
    stemming: Stemming,
    stems: Stems,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, applies pending migrations, and
    /// rebuilds the keyword index if it was built with other `stemming`.
    pub fn open(path: &Path, stemming: Stemming) -> Result<Self, KbError> {
        if let Some(parent) = path.parent() {
            if !parent.as_os_str().is_empty() {
                std::fs::create_dir_all(parent)?;
            }
        }
        let mut conn = pool::open(path)?;
        migrate(&mut conn, path)?;
        restem(&mut conn, stemming)?;
        let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        let pool = Pool::new(path, workers * 4, |conn| {
            conn.execute_batch(term_rank::VOCAB_DDL)?;
            conn.execute_batch(STEM_PROBE_DDL)
        });
        let vectors = VectorIndex::new(path);
        Ok(Self { pool, terms: TermRanker::default(), vectors, stemming, stems: Stems::default() })
    }

    pub fn path(&self) -> &Path {
        self.pool.path()
    }

    /// The connections, for the replica's copy ([`super::mirror`]), which writes rows as the
    /// shared database holds them.
    pub(super) fn pool(&self) -> &Pool {
        &self.pool
    }
}

/// Rebuilds the keyword index with `stemming`'s tokenizer unless it already has it. One
/// transaction: a crash leaves the old index whole, and readers see the old one until commit.
fn restem(conn: &mut rusqlite::Connection, stemming: Stemming) -> Result<(), KbError> {
    let current = |conn: &rusqlite::Connection| {
        conn.query_row("SELECT value FROM store_meta WHERE key = 'stemming'", [], |r| r.get::<_, i64>(0))
    };
    if current(conn)? == stemming.code() {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    // Another process may have rebuilt it while this one waited for the lock.
    if current(&tx)? == stemming.code() {
        return Ok(());
    }
    let chunks: i64 = tx.query_row("SELECT COUNT(*) FROM chunks", [], |r| r.get(0))?;
    // A large index takes a while (about 4 s per 100k chunks on 2 cores): say why the command waits.
    match chunks {
        0 => {}
        1..50_000 => tracing::info!(chunks, "rebuilding the keyword index for [retrieval] stemming = {stemming:?}"),
        _ => tracing::warn!(
            "rebuilding the keyword index of {chunks} chunks for [retrieval] stemming = {stemming:?}; \
             this runs once, in one transaction"
        ),
    }
    tx.execute_batch(&format!(
        "DROP TABLE chunks_fts;
         CREATE VIRTUAL TABLE chunks_fts USING fts5(
             text, title, content = 'chunks', content_rowid = 'id', tokenize = '{}'
         );
         INSERT INTO chunks_fts (chunks_fts, rank) VALUES ('rank', 'bm25(1.0, 1.5)');
         INSERT INTO chunks_fts (chunks_fts) VALUES ('rebuild');
         UPDATE store_meta SET value = {} WHERE key = 'stemming';
         UPDATE store_meta SET value = value + 1 WHERE key = 'generation';",
        stemming.tokenizer(),
        stemming.code()
    ))?;
    tx.commit()?;
    Ok(())
}

/// A per-connection FTS5 table with the stemming tokenizer, whose vocabulary gives the stem of
/// any word exactly as the index stems it: query terms are looked up in the index's own form,
/// and no second stemmer in Rust can disagree with SQLite's.
const STEM_PROBE_DDL: &str = "
    CREATE VIRTUAL TABLE IF NOT EXISTS temp.stem_probe USING fts5(word, tokenize = 'porter unicode61 remove_diacritics 2');
    CREATE VIRTUAL TABLE IF NOT EXISTS temp.stem_probe_vocab USING fts5vocab(temp, 'stem_probe', 'row');
";

/// Stems already asked for, shared by the store's connections.
#[derive(Default)]
struct Stems {
    known: std::sync::Mutex<HashMap<String, String>>,
}

/// Distinct words whose stems are kept; a query brings a handful, so this is years of queries.
const STEMS_KEPT: usize = 20_000;

impl Stems {
    /// The stem of one lower-case `word` (itself if the stemmer keeps it, or it is not one word).
    fn of(&self, conn: &rusqlite::Connection, word: &str) -> rusqlite::Result<String> {
        if let Some(stem) = self.known.lock().unwrap_or_else(|p| p.into_inner()).get(word) {
            return Ok(stem.clone());
        }
        // Emptied first, so a call that failed half-way cannot leave a row behind.
        conn.prepare_cached("DELETE FROM temp.stem_probe")?.execute([])?;
        conn.prepare_cached("INSERT INTO temp.stem_probe (rowid, word) VALUES (1, ?1)")?.execute([word])?;
        let terms: Vec<String> = conn
            .prepare_cached("SELECT term FROM temp.stem_probe_vocab")?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let stem = match terms.as_slice() {
            [one] => one.clone(),
            _ => word.to_string(),
        };
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() >= STEMS_KEPT {
            known.clear();
        }
        known.insert(word.to_string(), stem.clone());
        Ok(stem)
    }
}

fn migrate(conn: &mut rusqlite::Connection, path: &Path) -> Result<(), KbError> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Err(KbError::TooNew { path: path.display().to_string(), found: version, known });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

impl Store for SqliteStore {
    fn known_hashes(&self, source: &str) -> Result<HashMap<String, String>, KbError> {
        let conn = self.pool.get()?;
        let mut stmt = conn.prepare_cached("SELECT source_id, content_hash FROM documents WHERE source = ?1")?;
        let rows = stmt.query_map([source], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn apply(&self, changes: &[Change]) -> Result<(), KbError> {
        let mut conn = self.pool.get()?;
        let tx = conn.transaction()?;
        write(&tx, changes)?;
        tx.commit()?;
        Ok(())
    }

    fn begin(&self) -> Result<Box<dyn Writes + '_>, KbError> {
        let conn = self.pool.get()?;
        // IMMEDIATE takes the write lock now, so a second writer waits here (busy_timeout)
        // instead of failing half-way through the session.
        conn.execute_batch("BEGIN IMMEDIATE")?;
        Ok(Box::new(Session { conn, open: true }))
    }

    fn record_sync(&self, source: &str, error: Option<&str>, took: std::time::Duration) -> Result<(), KbError> {
        let conn = self.pool.get()?;
        conn.execute(
            "INSERT INTO sync_state (source, last_sync, last_error, syncs, failures, last_duration_ms)
             VALUES (?1, ?2, ?3, 1, ?4, ?5)
             ON CONFLICT (source) DO UPDATE SET last_sync = excluded.last_sync, last_error = excluded.last_error,
                 syncs = syncs + 1, failures = failures + excluded.failures,
                 last_duration_ms = excluded.last_duration_ms",
            params![source, super::now_rfc3339(), error, i64::from(error.is_some()), took.as_millis() as i64],
        )?;
        Ok(())
    }

    fn connector_state(&self, source: &str) -> Result<super::connector_state::Saved, KbError> {
        let conn = self.pool.get()?;
        super::connector_state::load(&conn, source)
    }

    fn stem(&self, word: &str) -> Result<String, KbError> {
        match self.stemming {
            Stemming::None => Ok(word.to_string()),
            Stemming::English => Ok(self.stems.of(&*self.pool.get()?, word)?),
        }
    }

    fn prefix_root(&self, prefix: &str) -> Result<String, KbError> {
        if self.stemming == Stemming::None {
            return Ok(prefix.to_string());
        }
        let conn = self.pool.get()?;
        let mut root = prefix;
        // Porter only ever rewrites a word's end, so some start of it is kept as is (in the
        // worst case its first character; words under three letters are never stemmed).
        while let Some((last, _)) = root.char_indices().next_back().filter(|(at, _)| *at > 0) {
            if self.stems.of(&conn, root)? == root {
                break;
            }
            root = &root[..last];
        }
        Ok(root.to_string())
    }

    fn keyword_candidates(
        &self,
        fts_query: &str,
        filter: &SearchFilter,
        limit: usize,
    ) -> Result<Vec<Candidate>, KbError> {
        let conn = self.pool.get()?;
        if let Some((phrases, join)) = topk::parse(fts_query) {
            // The index holds what the tokenizer made of the text: look up that form.
            let mut indexed = Vec::with_capacity(phrases.len());
            for phrase in phrases {
                let term = match self.stemming {
                    Stemming::None => phrase.text,
                    Stemming::English => self.stems.of(&conn, &phrase.text)?,
                };
                indexed.push(IndexPhrase { term, prefix: phrase.prefix });
            }
            let only = term_rank::Filter { sources: filter.sources.as_deref(), since: filter.since.as_deref() };
            if let Some(top) = self.terms.top(&conn, &indexed, join, only, limit)? {
                return candidates_by_id(&conn, &top);
            }
        }
        drop(conn);
        self.keyword_candidates_by_fts5(fts_query, filter, limit)
    }

    fn keyword_candidates_by_fts5(
        &self,
        fts_query: &str,
        filter: &SearchFilter,
        limit: usize,
    ) -> Result<Vec<Candidate>, KbError> {
        let conn = self.pool.get()?;
        // Without filters the ranked query reads the FTS index alone; with filters they sit in
        // the WHERE clause of the ranked query, so they apply before LIMIT. Either way chunk and
        // document rows are read for the top `limit` only.
        //
        // bm25() is called directly with the weights of the `rank` config: ordering by the
        // `rank` column makes FTS5 prepare and run a nested statement that scores and sorts
        // every match on each query, which measured about 40% slower at 10k chunks.
        let ranked = if filter.sources.is_none() && filter.since.is_none() {
            "SELECT rowid AS id, bm25(chunks_fts, 1.0, 1.5) AS rank FROM chunks_fts
             WHERE chunks_fts MATCH ?1 AND ?2 IS NULL AND ?3 IS NULL
             ORDER BY rank, id LIMIT ?4"
        } else {
            "SELECT chunks_fts.rowid AS id, bm25(chunks_fts, 1.0, 1.5) AS rank
             FROM chunks_fts JOIN chunks ch ON ch.id = chunks_fts.rowid
             WHERE chunks_fts MATCH ?1
               AND (?2 IS NULL OR ch.source IN (SELECT value FROM json_each(?2)))
               AND (?3 IS NULL OR ch.updated_at >= ?3)
             ORDER BY rank, id LIMIT ?4"
        };
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {CANDIDATE_COLUMNS}, -f.rank
             FROM ({ranked}) AS f
             JOIN chunks c ON c.id = f.id
             JOIN documents d ON d.id = c.document_id
             ORDER BY f.rank, f.id"
        ))?;
        let sources = filter.sources.as_ref().map(|s| serde_json::to_string(s).unwrap_or_default());
        let rows =
            stmt.query_map(params![fts_query, sources, filter.since, limit as i64], |r| candidate(r, r.get(8)?))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn semantic_candidates(
        &self,
        model: &str,
        query: &[f32],
        filter: &SearchFilter,
        limit: usize,
    ) -> Result<(Vec<Candidate>, vectors::Indexed), KbError> {
        let conn = self.pool.get()?;
        let (top, coverage) = self.vectors.top(&conn, model, query, filter, limit)?;
        Ok((candidates_by_id(&conn, &top)?, coverage))
    }

    fn vectors_to_reuse(
        &self,
        document_ids: &[&str],
        model: &str,
        dims: usize,
    ) -> Result<HashMap<String, Vec<f32>>, KbError> {
        if document_ids.is_empty() {
            return Ok(HashMap::new());
        }
        let conn = self.pool.get()?;
        let ids = serde_json::to_string(document_ids).unwrap_or_default();
        let mut stmt = conn.prepare_cached(
            "SELECT c.title, c.text, v.vector, m.dims FROM chunks c
             JOIN chunk_vectors v ON v.chunk_id = c.id JOIN embedding_models m ON m.id = v.model_id
             WHERE c.document_id IN (SELECT value FROM json_each(?1)) AND m.name = ?2 AND m.dims = ?3",
        )?;
        let mut rows = stmt.query(params![ids, model, dims as i64])?;
        let mut out = HashMap::new();
        while let Some(row) = rows.next()? {
            let (title, text): (String, String) = (row.get(0)?, row.get(1)?);
            let (blob, dims): (Vec<u8>, i64) = (row.get(2)?, row.get(3)?);
            if let Some(v) = vectors::from_blob(&blob, dims as usize) {
                out.insert(vectors::embed_text(&title, &text), v);
            }
        }
        Ok(out)
    }

    fn unembedded(&self, model: &str, dims: usize, after: i64, limit: usize) -> Result<Vec<(i64, String)>, KbError> {
        let conn = self.pool.get()?;
        // From a cursor: a backfill's next batch starts where the last one ended, instead of
        // walking past every chunk it already embedded.
        let mut stmt = conn.prepare_cached(
            "SELECT c.id, c.title, c.text FROM chunks c
             WHERE c.id > ?3
               AND NOT EXISTS (SELECT 1 FROM chunk_vectors v JOIN embedding_models m ON m.id = v.model_id
                               WHERE v.chunk_id = c.id AND m.name = ?1 AND m.dims = ?2)
             ORDER BY c.id LIMIT ?4",
        )?;
        let rows = stmt.query_map(params![model, dims as i64, after, limit as i64], |r| {
            Ok((r.get(0)?, vectors::embed_text(&r.get::<_, String>(1)?, &r.get::<_, String>(2)?)))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn put_vectors(&self, model: &str, dims: usize, rows: &[(i64, Vec<f32>)]) -> Result<(), KbError> {
        let mut conn = self.pool.get()?;
        let tx = conn.transaction()?;
        let id = vectors::model_id(&tx, model, dims)?;
        for (chunk, vector) in rows {
            vectors::put(&tx, *chunk, id, vector)?;
        }
        // Only vectors changed: the keyword lists cached on `generation` stay valid.
        tx.prepare_cached("UPDATE store_meta SET value = value + 1 WHERE key = 'vector_generation'")?.execute([])?;
        tx.commit()?;
        Ok(())
    }

    fn coverage(&self) -> Result<vectors::Coverage, KbError> {
        let conn = self.pool.get()?;
        Ok(vectors::coverage(&conn)?)
    }

    fn chunk_texts(&self, chunk_ids: &[i64]) -> Result<HashMap<i64, String>, KbError> {
        if chunk_ids.is_empty() {
            return Ok(HashMap::new());
        }
        let conn = self.pool.get()?;
        let ids = serde_json::to_string(chunk_ids).unwrap_or_default();
        let mut stmt =
            conn.prepare_cached("SELECT id, text FROM chunks WHERE id IN (SELECT value FROM json_each(?1))")?;
        let rows = stmt.query_map([ids], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn document(&self, id: &str) -> Result<Option<types::Document>, KbError> {
        let conn = self.pool.get()?;
        let row = conn
            .prepare_cached(
                "SELECT id, source, source_id, title, body, content_type, source_url, author, created_at,
                        updated_at, metadata_json, content_hash
                 FROM documents WHERE id = ?1",
            )?
            .query_row([id], |r| {
                let metadata: String = r.get(10)?;
                Ok(types::Document {
                    id: r.get(0)?,
                    source: r.get(1)?,
                    source_id: r.get(2)?,
                    title: r.get(3)?,
                    body: r.get(4)?,
                    content_type: r.get(5)?,
                    source_url: r.get(6)?,
                    author: r.get(7)?,
                    created_at: r.get(8)?,
                    updated_at: r.get(9)?,
                    metadata: serde_json::from_str(&metadata).ok().filter(|v: &Value| !v.is_null()),
                    content_hash: r.get(11)?,
                    chunks: Vec::new(),
                })
            })
            .optional()?;
        let Some(mut doc) = row else { return Ok(None) };
        let mut stmt =
            conn.prepare_cached("SELECT idx, text, tokens FROM chunks WHERE document_id = ?1 ORDER BY idx")?;
        doc.chunks = stmt
            .query_map([id], |r| {
                Ok(types::Chunk {
                    index: r.get::<_, i64>(0)? as u64,
                    text: r.get(1)?,
                    tokens: r.get::<_, i64>(2)? as u64,
                })
            })?
            .collect::<Result<_, _>>()?;
        Ok(Some(doc))
    }

    fn sources(&self) -> Result<Vec<SourceRow>, KbError> {
        let conn = self.pool.get()?;
        let mut stmt = conn.prepare_cached(
            "WITH names AS (SELECT source FROM documents UNION SELECT source FROM sync_state)
             SELECT n.source,
                    (SELECT COUNT(*) FROM documents d WHERE d.source = n.source),
                    (SELECT COUNT(*) FROM chunks c WHERE c.source = n.source),
                    s.last_sync, s.last_error, COALESCE(s.syncs, 0), COALESCE(s.failures, 0), s.last_duration_ms
             FROM names n LEFT JOIN sync_state s ON s.source = n.source
             ORDER BY n.source",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(SourceRow {
                source: r.get(0)?,
                documents: r.get(1)?,
                chunks: r.get(2)?,
                last_sync: r.get(3)?,
                last_error: r.get(4)?,
                syncs: r.get(5)?,
                failures: r.get(6)?,
                last_duration_ms: r.get(7)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn source_names(&self) -> Result<Vec<String>, KbError> {
        let conn = self.pool.get()?;
        let mut stmt = conn.prepare_cached("SELECT source FROM sync_state ORDER BY source")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn stats(&self) -> Result<Stats, KbError> {
        let conn = self.pool.get()?;
        let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0));
        let database_bytes = std::fs::metadata(self.path()).map(|m| m.len()).unwrap_or(0)
            + std::fs::metadata(self.path().with_extension("sqlite-wal")).map(|m| m.len()).unwrap_or(0);
        Ok(Stats {
            documents: count("SELECT COUNT(*) FROM documents")?,
            chunks: count("SELECT COUNT(*) FROM chunks")?,
            sources: count("SELECT COUNT(DISTINCT source) FROM documents")?,
            database_bytes,
            schema_version: count("PRAGMA user_version")?,
            vectors: vectors::coverage(&conn)?
                .models
                .into_iter()
                .map(|(model, dims, chunks)| ModelVectors { model, dims, chunks })
                .collect(),
        })
    }

    fn remove_source(&self, source: &str) -> Result<Removed, KbError> {
        let mut conn = self.pool.get()?;
        // IMMEDIATE: the counts read here are the rows deleted, whatever a sync does meanwhile.
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let chunks: i64 =
            tx.prepare_cached("SELECT COUNT(*) FROM chunks WHERE source = ?1")?.query_row([source], |r| r.get(0))?;
        let ids: Vec<String> = tx
            .prepare_cached("SELECT source_id FROM documents WHERE source = ?1")?
            .query_map([source], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        // Through the same writes as a sync's deletions, so the index rows go exactly as they do
        // there; vectors cascade with the chunks. `write` bumps the generation readers cache on.
        let changes: Vec<Change> =
            ids.iter().map(|id| Change::Delete { source: source.to_string(), source_id: id.clone() }).collect();
        write(&tx, &changes)?;
        // A source configured again under this name starts over: no last sync, no saved cursor.
        tx.prepare_cached("DELETE FROM sync_state WHERE source = ?1")?.execute([source])?;
        tx.prepare_cached("DELETE FROM connector_state WHERE source = ?1")?.execute([source])?;
        tx.commit()?;
        Ok(Removed { documents: ids.len() as i64, chunks })
    }
}

/// The columns [`candidate`] reads, first in every candidate query (`c` = chunks, `d` = documents).
const CANDIDATE_COLUMNS: &str =
    "c.id, c.document_id, c.idx, c.title, c.source, d.source_url, c.updated_at, d.source_id";

fn candidate(r: &rusqlite::Row<'_>, score: f64) -> rusqlite::Result<Candidate> {
    Ok(Candidate {
        chunk_id: r.get(0)?,
        document_id: r.get(1)?,
        chunk_index: r.get(2)?,
        score,
        title: r.get(3)?,
        source: r.get(4)?,
        source_url: r.get(5)?,
        updated_at: r.get(6)?,
        source_id: r.get(7)?,
    })
}

/// The candidate rows of `(chunk id, score)` pairs, in the order given.
fn candidates_by_id(conn: &rusqlite::Connection, ranked: &[(i64, f64)]) -> Result<Vec<Candidate>, KbError> {
    if ranked.is_empty() {
        return Ok(Vec::new());
    }
    let ids = serde_json::to_string(&ranked.iter().map(|(id, _)| id).collect::<Vec<_>>()).unwrap_or_default();
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {CANDIDATE_COLUMNS}
         FROM chunks c JOIN documents d ON d.id = c.document_id
         WHERE c.id IN (SELECT value FROM json_each(?1))"
    ))?;
    let mut rows: HashMap<i64, Candidate> = stmt
        .query_map([ids], |r| candidate(r, 0.0))?
        .map(|row| row.map(|c| (c.chunk_id, c)))
        .collect::<Result<_, _>>()?;
    Ok(ranked.iter().filter_map(|&(id, score)| rows.remove(&id).map(|c| Candidate { score, ..c })).collect())
}

/// The statements of one batch of changes, inside whatever transaction `tx` is in.
fn write(tx: &rusqlite::Connection, changes: &[Change]) -> Result<(), KbError> {
    let mut first_new_chunk: Option<i64> = None;
    for change in changes {
        match change {
            Change::Upsert(doc) => {
                if let Some(id) = upsert(tx, doc)? {
                    first_new_chunk.get_or_insert(id);
                }
            }
            Change::Delete { source, source_id } => {
                tx.prepare_cached(
                    "INSERT INTO chunks_fts (chunks_fts, rowid, text, title)
                     SELECT 'delete', c.id, c.text, c.title FROM chunks c JOIN documents d ON d.id = c.document_id
                     WHERE d.source = ?1 AND d.source_id = ?2",
                )?
                .execute(params![source, source_id])?;
                tx.prepare_cached("DELETE FROM documents WHERE source = ?1 AND source_id = ?2")?
                    .execute(params![source, source_id])?;
            }
            Change::SourceSynced { source, started_at, state } => {
                super::connector_state::save(tx, source, started_at, state.as_ref())?;
            }
        }
    }
    // Every chunk inserted by this call has an id at or above the first one (ids are max + 1
    // and no chunk inserted here is deleted here), so one statement indexes them all.
    if let Some(first) = first_new_chunk {
        tx.prepare_cached(
            "INSERT INTO chunks_fts (rowid, text, title) SELECT id, text, title FROM chunks WHERE id >= ?1",
        )?
        .execute([first])?;
    }
    // Readers cache what documents hold; a connector's own state is not theirs to see.
    if changes.iter().any(|c| !matches!(c, Change::SourceSynced { .. })) {
        tx.prepare_cached("UPDATE store_meta SET value = value + 1 WHERE key = 'generation'")?.execute([])?;
    }
    Ok(())
}

/// The SQLite [`Writes`]: a pooled connection inside `BEGIN IMMEDIATE`.
struct Session<'a> {
    conn: Pooled<'a>,
    /// The transaction has not ended yet; dropping the session then rolls it back.
    open: bool,
}

impl Writes for Session<'_> {
    fn apply(&mut self, changes: &[Change]) -> Result<(), KbError> {
        write(&self.conn, changes)
    }

    fn commit(mut self: Box<Self>) -> Result<(), KbError> {
        self.conn.execute_batch("COMMIT")?;
        self.open = false;
        Ok(())
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if self.open {
            // A failed rollback leaves the connection in its transaction; the pool then drops
            // it instead of reusing it, and closing it rolls back.
            if let Err(e) = self.conn.execute_batch("ROLLBACK") {
                tracing::warn!("rolling back a sync's writes failed: {e}");
            }
        }
    }
}

/// Writes a document and its chunks; returns the id of its first new chunk. The caller indexes
/// the new chunks in FTS.
fn upsert(tx: &rusqlite::Connection, doc: &NewDocument) -> Result<Option<i64>, KbError> {
    let existing: i64 =
        tx.prepare_cached("SELECT COUNT(*) FROM chunks WHERE document_id = ?1")?.query_row([&doc.id], |r| r.get(0))?;
    if existing > 0 {
        tx.prepare_cached(
            "INSERT INTO chunks_fts (chunks_fts, rowid, text, title)
             SELECT 'delete', id, text, title FROM chunks WHERE document_id = ?1",
        )?
        .execute([&doc.id])?;
        tx.prepare_cached("DELETE FROM chunks WHERE document_id = ?1")?.execute([&doc.id])?;
    }
    tx.prepare_cached(
        "INSERT INTO documents (id, source, source_id, title, body, content_type, source_url, author,
                                created_at, updated_at, metadata_json, content_hash)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
         ON CONFLICT (id) DO UPDATE SET
             title = excluded.title, body = excluded.body, content_type = excluded.content_type,
             source_url = excluded.source_url, author = excluded.author, created_at = excluded.created_at,
             updated_at = excluded.updated_at, metadata_json = excluded.metadata_json,
             content_hash = excluded.content_hash",
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
        doc.metadata.to_string(),
        doc.content_hash,
    ])?;
    let mut first = None;
    let model = match &doc.vectors {
        Some(v) if v.rows.len() == doc.chunks.len() => Some((vectors::model_id(tx, &v.model, v.dims)?, &v.rows)),
        _ => None,
    };
    let mut insert = tx.prepare_cached(
        "INSERT INTO chunks (document_id, idx, text, tokens, title, source, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    for (i, chunk) in doc.chunks.iter().enumerate() {
        insert.execute(params![
            doc.id,
            chunk.index as i64,
            chunk.text,
            chunk.tokens as i64,
            doc.title,
            doc.source,
            doc.updated_at
        ])?;
        let id = tx.last_insert_rowid();
        first.get_or_insert(id);
        if let Some((model, rows)) = model {
            vectors::put(tx, id, model, &rows[i])?;
        }
    }
    Ok(first)
}
