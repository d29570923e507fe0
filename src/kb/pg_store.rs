//! The knowledge base on the shared PostgreSQL database (`[db] url`).
//!
//! PostgreSQL holds every document, chunk, vector and source record: it is what every replica
//! writes and the truth they agree on. Each replica reads from its own SQLite copy of it
//! ([`super::mirror`]), so keyword search ranks with FTS5's exact BM25 from posting lists in
//! memory (PostgreSQL's `ts_rank` measured 4 to 30 times over the 10 ms bar at 100k chunks, and
//! tokenizes differently), and semantic search scans the same in-memory index as on a laptop.
//!
//! Every write transaction marks the rows it writes with generation 0 and, as it commits, takes
//! the knowledge base's advisory lock, draws the next generation and stamps it on those rows.
//! Generations therefore commit in order, and a copy at generation g catches up by reading the
//! rows stamped after g (documents, their chunks, vectors, and tombstones of deleted documents)
//! in one snapshot. A read first checks the generation (one short query, at most every
//! [`FRESH`]); a write catches up at once, so a replica reads its own writes.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use deadpool_postgres::Object;
use tokio_postgres::GenericClient;

use super::mirror::{self, Batch, Doc};
use super::store::Candidate;
use super::store::{
    Change, Claim, NewDocument, Removed, SearchFilter, SourceRow, SqliteStore, Stats, Stemming, Store, Writes,
};
use super::{connector_state, vectors, KbError};
use crate::db::migrate::{Component, Migration};
use crate::db::{DbError, Pg};
use crate::types;

/// The knowledge base's tables in the shared database.
// Static: immutable, a store's migrations: SQL text compiled in, the same for every application.
pub static PG: Component = Component {
    name: "kb",
    migrations: &[Migration {
        version: 1,
        name: "documents, chunks, vectors, sources and their generations",
        sql: "
CREATE TABLE kb_state (
    id            INT4 PRIMARY KEY CHECK (id = 1),
    generation    INT8 NOT NULL,
    -- Who this knowledge base is: a replica's copy of another database is thrown away.
    instance      INT8 NOT NULL,
    -- Tombstones below this generation were pruned: a copy older than that starts over.
    pruned_below  INT8 NOT NULL DEFAULT 0
);
INSERT INTO kb_state (id, generation, instance)
VALUES (1, 1, (random() * 4000000000000000)::int8 + 1);
CREATE TABLE kb_documents (
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
    metadata_json TEXT NOT NULL,
    content_hash  TEXT NOT NULL,
    generation    INT8 NOT NULL,
    UNIQUE (source, source_id)
);
CREATE INDEX kb_documents_generation ON kb_documents (generation);
CREATE TABLE kb_chunks (
    id            BIGSERIAL PRIMARY KEY,
    document_id   TEXT NOT NULL REFERENCES kb_documents (id) ON DELETE CASCADE,
    idx           INT8 NOT NULL,
    text          TEXT NOT NULL,
    tokens        INT8 NOT NULL,
    UNIQUE (document_id, idx)
);
CREATE TABLE kb_models (
    id            SERIAL PRIMARY KEY,
    name          TEXT NOT NULL,
    dims          INT4 NOT NULL,
    UNIQUE (name, dims)
);
CREATE TABLE kb_vectors (
    chunk_id      INT8 PRIMARY KEY REFERENCES kb_chunks (id) ON DELETE CASCADE,
    model_id      INT4 NOT NULL REFERENCES kb_models (id),
    vector        BYTEA NOT NULL,
    generation    INT8 NOT NULL
);
CREATE INDEX kb_vectors_generation ON kb_vectors (generation);
CREATE TABLE kb_deletions (
    document_id   TEXT NOT NULL,
    generation    INT8 NOT NULL,
    at            TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX kb_deletions_generation ON kb_deletions (generation);
CREATE TABLE kb_sync_state (
    source           TEXT PRIMARY KEY,
    last_sync        TEXT NOT NULL,
    last_error       TEXT,
    syncs            INT8 NOT NULL DEFAULT 0,
    failures         INT8 NOT NULL DEFAULT 0,
    last_duration_ms INT8,
    generation       INT8 NOT NULL
);
CREATE TABLE kb_connector_state (
    source        TEXT PRIMARY KEY,
    last_success  TEXT NOT NULL,
    state_json    TEXT NOT NULL DEFAULT '{}',
    generation    INT8 NOT NULL
);
",
    }],
    tables: &[
        "kb_state",
        "kb_documents",
        "kb_chunks",
        "kb_models",
        "kb_vectors",
        "kb_deletions",
        "kb_sync_state",
        "kb_connector_state",
    ],
};

/// How long a read trusts the copy without asking PostgreSQL for its generation.
const FRESH: Duration = Duration::from_millis(50);

/// How long tombstones of deleted documents are kept: a copy that was away longer starts over.
const TOMBSTONES_KEPT: &str = "1 day";

/// The knowledge base of a replica: PostgreSQL, read through a local copy.
pub struct PgStore {
    pg: Pg,
    copy: SqliteStore,
    /// The shared knowledge base's identity (`kb_state.instance`).
    instance: i64,
    caught_up: Mutex<CaughtUp>,
}

struct CaughtUp {
    checked: Option<Instant>,
    /// The last catch-up failed for want of the database (said once in the log).
    stale: bool,
}

impl PgStore {
    /// The shared knowledge base of `pg` (migrated with [`PG`]), with its copy at `copy_path`:
    /// a copy of another database, or none, is made afresh.
    pub fn open(pg: Pg, copy_path: &Path, stemming: Stemming) -> Result<PgStore, KbError> {
        let instance: i64 = pg
            .run(|client| async move { client.query_one("SELECT instance FROM kb_state WHERE id = 1", &[]).await })
            .map_err(KbError::Database)?
            .get(0);
        let mut copy = SqliteStore::open(copy_path, stemming)?;
        let (of, _) = mirror::position(&copy)?;
        if of != instance && of != 0 {
            tracing::info!(path = %copy_path.display(), "the local copy of the knowledge base is of another database; making it afresh");
            drop(copy);
            for suffix in ["", "-wal", "-shm"] {
                let file = format!("{}{suffix}", copy_path.display());
                let _ = std::fs::remove_file(file);
            }
            copy = SqliteStore::open(copy_path, stemming)?;
        }
        let store = PgStore { pg, copy, instance, caught_up: Mutex::new(CaughtUp { checked: None, stale: false }) };
        store.catch_up(true)?;
        Ok(store)
    }

    /// Brings the copy up to PostgreSQL's generation: always when `force`, else when it was
    /// last checked more than [`FRESH`] ago. While the database is away, reads go on from the
    /// copy as it is (said once in the log); writes fail.
    fn catch_up(&self, force: bool) -> Result<(), KbError> {
        // Most searches find the copy checked a moment ago, or another search checking it:
        // they go on at once, without telling tokio they might block.
        if !force {
            match self.caught_up.try_lock() {
                Ok(state) if state.checked.is_some_and(|at| at.elapsed() < FRESH) => return Ok(()),
                Err(std::sync::TryLockError::WouldBlock) => return Ok(()),
                _ => {}
            }
        }
        // The lock is held across a query: waiting for it is waiting for the database.
        crate::db::blocking(|| self.catch_up_now(force))
    }

    fn catch_up_now(&self, force: bool) -> Result<(), KbError> {
        let mut state = match self.caught_up.try_lock() {
            Ok(state) => state,
            // Another search is catching the copy up: this one reads it as it is, a moment old.
            Err(std::sync::TryLockError::WouldBlock) if !force => return Ok(()),
            Err(std::sync::TryLockError::WouldBlock) => self.caught_up.lock().unwrap_or_else(|p| p.into_inner()),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        };
        if !force && state.checked.is_some_and(|at| at.elapsed() < FRESH) {
            return Ok(());
        }
        // The file's own generation, not this process's: several processes of one folder (a
        // server and a `ctx sync` beside it) share the copy.
        let since = mirror::position(&self.copy)?.1;
        let fetched = self.pg.run(move |mut client| async move { fetch(&mut client, since).await });
        let batch = match fetched {
            Ok(batch) => batch,
            Err(e) if e.is_unavailable() && !force => {
                if !state.stale {
                    tracing::warn!("searching the local copy of the knowledge base as of generation {since}: {e}");
                    state.stale = true;
                }
                state.checked = Some(Instant::now());
                return Ok(());
            }
            Err(e) => return Err(KbError::Database(e)),
        };
        state.stale = false;
        if let Some(batch) = batch {
            mirror::apply(&self.copy, self.instance, &batch)?;
        }
        state.checked = Some(Instant::now());
        Ok(())
    }

    fn read(&self) -> Result<&SqliteStore, KbError> {
        self.catch_up(false)?;
        Ok(&self.copy)
    }

    /// Runs `work` in one write transaction that ends by stamping its rows with the next
    /// generation, then catches the copy up.
    fn write<T, F, Fut>(&self, work: F) -> Result<T, KbError>
    where
        T: Send + 'static,
        F: FnOnce(Object) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = (Object, Result<T, tokio_postgres::Error>)> + Send,
    {
        let client = begin(&self.pg)?;
        let (_, value) = on(&self.pg, client, move |client| async move {
            let (client, done) = work(client).await;
            let done = match done {
                Ok(value) => finish(&client).await.map(|()| value),
                Err(e) => Err(e),
            };
            (client, done)
        })?;
        self.catch_up(true)?;
        Ok(value)
    }
}

/// A pooled connection inside `BEGIN`.
fn begin(pg: &Pg) -> Result<Object, KbError> {
    pg.run(|client| async move {
        client.batch_execute("BEGIN").await?;
        Ok(client)
    })
    .map_err(KbError::Database)
}

/// Stamps the transaction's rows and commits.
async fn finish(client: &Object) -> Result<(), tokio_postgres::Error> {
    stamp(&***client).await?;
    client.batch_execute("COMMIT").await
}

/// Runs `work` on `client`, waiting from sync code. On an error the transaction is rolled back
/// (or, failing that, the connection closed) so the pool never hands out an aborted one.
fn on<T, F, Fut>(pg: &Pg, client: Object, work: F) -> Result<(Object, T), KbError>
where
    T: Send + 'static,
    F: FnOnce(Object) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = (Object, Result<T, tokio_postgres::Error>)> + Send,
{
    let (client, result) = crate::db::block(async move { Ok(work(client).await) }).map_err(KbError::Database)?;
    match result {
        Ok(value) => Ok((client, value)),
        Err(e) => {
            let error = pg.classify(&e);
            discard(client);
            Err(KbError::Database(error))
        }
    }
}

/// Ends `client`'s transaction without committing it.
fn discard(client: Object) {
    let _ = crate::db::block(async move {
        if client.batch_execute("ROLLBACK").await.is_err() {
            drop(Object::take(client));
        }
        Ok(())
    });
}

/// Draws the next generation under the knowledge base's lock and stamps this transaction's rows.
async fn stamp(client: &impl GenericClient) -> Result<i64, tokio_postgres::Error> {
    client.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || 'ctx kb'))", &[]).await?;
    let generation: i64 =
        client.query_one("UPDATE kb_state SET generation = generation + 1 RETURNING generation", &[]).await?.get(0);
    for table in ["kb_documents", "kb_vectors", "kb_deletions", "kb_sync_state", "kb_connector_state"] {
        client
            .execute(&format!("UPDATE {table} SET generation = $1::int8 WHERE generation = 0"), &[&generation])
            .await?;
    }
    Ok(generation)
}

/// What changed after generation `since`, read in one snapshot; `None` when nothing did.
async fn fetch(client: &mut Object, since: i64) -> Result<Option<Batch>, tokio_postgres::Error> {
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let row = tx.query_one("SELECT generation, pruned_below FROM kb_state WHERE id = 1", &[]).await?;
    let (generation, pruned_below): (i64, i64) = (row.get(0), row.get(1));
    if generation == since {
        return Ok(None);
    }
    // A new copy, one too far behind (tombstones it needs were pruned), or one ahead of the
    // database (restored from a backup under it): everything.
    let full = since == 0 || since < pruned_below || generation < since;
    let after = if full { 0 } else { since };
    let mut batch = Batch { generation, full, ..Default::default() };
    if !full {
        batch.deleted = tx
            .query("SELECT DISTINCT document_id FROM kb_deletions WHERE generation > $1::int8", &[&after])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
    }
    let docs = tx
        .query(
            "SELECT id, source, source_id, title, body, content_type, source_url, author, created_at, updated_at,
                    metadata_json, content_hash
             FROM kb_documents WHERE generation > $1::int8",
            &[&after],
        )
        .await?;
    let mut chunks: HashMap<String, Vec<(i64, i64, String, i64)>> = HashMap::new();
    for r in tx
        .query(
            "SELECT c.document_id, c.id, c.idx, c.text, c.tokens FROM kb_chunks c
             JOIN kb_documents d ON d.id = c.document_id WHERE d.generation > $1::int8 ORDER BY c.id",
            &[&after],
        )
        .await?
    {
        chunks.entry(r.get(0)).or_default().push((r.get(1), r.get(2), r.get(3), r.get(4)));
    }
    batch.documents = docs
        .iter()
        .map(|r| {
            let id: String = r.get(0);
            Doc {
                chunks: chunks.remove(&id).unwrap_or_default(),
                id,
                source: r.get(1),
                source_id: r.get(2),
                title: r.get(3),
                body: r.get(4),
                content_type: r.get(5),
                source_url: r.get(6),
                author: r.get(7),
                created_at: r.get(8),
                updated_at: r.get(9),
                metadata_json: r.get(10),
                content_hash: r.get(11),
            }
        })
        .collect();
    batch.vectors = tx
        .query(
            "SELECT v.chunk_id, m.name, m.dims::int8, v.vector FROM kb_vectors v JOIN kb_models m ON m.id = v.model_id
             WHERE v.generation > $1::int8",
            &[&after],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    batch.sync_state = tx
        .query("SELECT source, last_sync, last_error, syncs, failures, last_duration_ms FROM kb_sync_state", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect();
    batch.connector_state = tx
        .query("SELECT source, last_success, state_json FROM kb_connector_state", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    tx.commit().await?;
    Ok(Some(batch))
}

/// The statements of one batch of changes, inside the caller's transaction; rows get generation
/// 0 until [`stamp`].
async fn apply_changes(client: &impl GenericClient, changes: &[Change]) -> Result<(), tokio_postgres::Error> {
    let mut rest = changes;
    while !rest.is_empty() {
        // A run of new or changed documents goes in a few statements, not a few per document:
        // a sync's batch costs a handful of round trips.
        let run = rest.iter().take_while(|c| matches!(c, Change::Upsert(_))).count();
        if run > 1 {
            let docs: Vec<&NewDocument> = rest[..run]
                .iter()
                .filter_map(|c| if let Change::Upsert(doc) = c { Some(&**doc) } else { None })
                .collect();
            let distinct: std::collections::HashSet<&str> = docs.iter().map(|d| d.id.as_str()).collect();
            // The same document twice in one run would be one row written twice by one
            // statement, which PostgreSQL refuses: those go one by one.
            if distinct.len() == docs.len() {
                upsert_many(client, &docs).await?;
                rest = &rest[run..];
                continue;
            }
        }
        apply_one(client, &rest[0]).await?;
        rest = &rest[1..];
    }
    Ok(())
}

/// Writes documents and their chunks (and vectors) in a few statements.
async fn upsert_many(client: &impl GenericClient, docs: &[&NewDocument]) -> Result<(), tokio_postgres::Error> {
    let column = |f: &dyn Fn(&NewDocument) -> String| docs.iter().map(|d| f(d)).collect::<Vec<String>>();
    let optional =
        |f: &dyn Fn(&NewDocument) -> Option<String>| docs.iter().map(|d| f(d)).collect::<Vec<Option<String>>>();
    let ids = column(&|d| d.id.clone());
    client.execute("DELETE FROM kb_chunks WHERE document_id = ANY($1::text[])", &[&ids]).await?;
    client
        .execute(
            "INSERT INTO kb_documents (id, source, source_id, title, body, content_type, source_url, author,
                                       created_at, updated_at, metadata_json, content_hash, generation)
             SELECT *, 0 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                                     $8::text[], $9::text[], $10::text[], $11::text[], $12::text[])
             ON CONFLICT (id) DO UPDATE SET
                 title = excluded.title, body = excluded.body, content_type = excluded.content_type,
                 source_url = excluded.source_url, author = excluded.author, created_at = excluded.created_at,
                 updated_at = excluded.updated_at, metadata_json = excluded.metadata_json,
                 content_hash = excluded.content_hash, generation = 0",
            &[
                &ids,
                &column(&|d| d.source.clone()),
                &column(&|d| d.source_id.clone()),
                &column(&|d| d.title.clone()),
                &column(&|d| d.body.clone()),
                &column(&|d| d.content_type.clone()),
                &optional(&|d| d.source_url.clone()),
                &optional(&|d| d.author.clone()),
                &column(&|d| d.created_at.clone()),
                &column(&|d| d.updated_at.clone()),
                &column(&|d| d.metadata.to_string()),
                &column(&|d| d.content_hash.clone()),
            ],
        )
        .await?;
    let (mut owner, mut idx, mut text, mut tokens) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for doc in docs {
        for chunk in &doc.chunks {
            owner.push(doc.id.as_str());
            idx.push(chunk.index as i64);
            text.push(chunk.text.as_str());
            tokens.push(chunk.tokens as i64);
        }
    }
    let inserted = client
        .query(
            "INSERT INTO kb_chunks (document_id, idx, text, tokens)
             SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::int8[])
             RETURNING id, document_id, idx",
            &[&owner, &idx, &text, &tokens],
        )
        .await?;
    if docs.iter().all(|d| d.vectors.is_none()) {
        return Ok(());
    }
    let chunk_ids: HashMap<(String, i64), i64> =
        inserted.iter().map(|r| ((r.get::<_, String>(1), r.get::<_, i64>(2)), r.get::<_, i64>(0))).collect();
    for doc in docs {
        let Some(v) = doc.vectors.as_ref().filter(|v| v.rows.len() == doc.chunks.len()) else { continue };
        let model = model_id(client, &v.model, v.dims).await?;
        let ids: Vec<i64> =
            doc.chunks.iter().filter_map(|c| chunk_ids.get(&(doc.id.clone(), c.index as i64)).copied()).collect();
        let blobs: Vec<Vec<u8>> = v.rows.iter().map(|row| vectors::to_blob(row)).collect();
        put_vectors(client, model, &ids, &blobs).await?;
    }
    Ok(())
}

/// One change, on its own.
async fn apply_one(client: &impl GenericClient, change: &Change) -> Result<(), tokio_postgres::Error> {
    {
        match change {
            Change::Upsert(doc) => {
                client.execute("DELETE FROM kb_chunks WHERE document_id = $1::text", &[&doc.id]).await?;
                client
                    .execute(
                        "INSERT INTO kb_documents (id, source, source_id, title, body, content_type, source_url, author,
                                                   created_at, updated_at, metadata_json, content_hash, generation)
                         VALUES ($1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, $8::text,
                                 $9::text, $10::text, $11::text, $12::text, 0)
                         ON CONFLICT (id) DO UPDATE SET
                             title = excluded.title, body = excluded.body, content_type = excluded.content_type,
                             source_url = excluded.source_url, author = excluded.author, created_at = excluded.created_at,
                             updated_at = excluded.updated_at, metadata_json = excluded.metadata_json,
                             content_hash = excluded.content_hash, generation = 0",
                        &[
                            &doc.id,
                            &doc.source,
                            &doc.source_id,
                            &doc.title,
                            &doc.body,
                            &doc.content_type,
                            &doc.source_url,
                            &doc.author,
                            &doc.created_at,
                            &doc.updated_at,
                            &doc.metadata.to_string(),
                            &doc.content_hash,
                        ],
                    )
                    .await?;
                let idx: Vec<i64> = doc.chunks.iter().map(|c| c.index as i64).collect();
                let text: Vec<&str> = doc.chunks.iter().map(|c| c.text.as_str()).collect();
                let tokens: Vec<i64> = doc.chunks.iter().map(|c| c.tokens as i64).collect();
                let inserted = client
                    .query(
                        "INSERT INTO kb_chunks (document_id, idx, text, tokens)
                         SELECT $1::text, u.idx, u.text, u.tokens
                         FROM unnest($2::int8[], $3::text[], $4::int8[]) AS u(idx, text, tokens)
                         RETURNING id, idx",
                        &[&doc.id, &idx, &text, &tokens],
                    )
                    .await?;
                if let Some(v) = doc.vectors.as_ref().filter(|v| v.rows.len() == doc.chunks.len()) {
                    let by_idx: HashMap<i64, i64> = inserted.iter().map(|r| (r.get(1), r.get(0))).collect();
                    let model = model_id(client, &v.model, v.dims).await?;
                    let ids: Vec<i64> = idx.iter().filter_map(|i| by_idx.get(i).copied()).collect();
                    let blobs: Vec<Vec<u8>> = v.rows.iter().map(|row| vectors::to_blob(row)).collect();
                    put_vectors(client, model, &ids, &blobs).await?;
                }
            }
            Change::Delete { source, source_id } => {
                client
                    .execute(
                        "INSERT INTO kb_deletions (document_id, generation)
                         SELECT id, 0 FROM kb_documents WHERE source = $1::text AND source_id = $2::text",
                        &[source, source_id],
                    )
                    .await?;
                client
                    .execute(
                        "DELETE FROM kb_documents WHERE source = $1::text AND source_id = $2::text",
                        &[source, source_id],
                    )
                    .await?;
            }
            Change::SourceSynced { source, started_at, state } => {
                let state = state.as_ref().map(|v| serde_json::Value::Object(v.clone()).to_string());
                client
                    .execute(
                        "INSERT INTO kb_connector_state (source, last_success, state_json, generation)
                         VALUES ($1::text, $2::text, COALESCE($3::text, '{}'), 0)
                         ON CONFLICT (source) DO UPDATE SET last_success = excluded.last_success,
                             state_json = COALESCE($3::text, kb_connector_state.state_json), generation = 0",
                        &[source, started_at, &state],
                    )
                    .await?;
            }
        }
    }
    Ok(())
}

/// The id of model `name` with `dims` dimensions, created if new.
async fn model_id(client: &impl GenericClient, name: &str, dims: usize) -> Result<i32, tokio_postgres::Error> {
    let dims = dims as i32;
    client
        .execute(
            "INSERT INTO kb_models (name, dims) VALUES ($1::text, $2::int4) ON CONFLICT (name, dims) DO NOTHING",
            &[&name, &dims],
        )
        .await?;
    Ok(client
        .query_one("SELECT id FROM kb_models WHERE name = $1::text AND dims = $2::int4", &[&name, &dims])
        .await?
        .get(0))
}

/// Writes vectors of chunks that exist (a chunk replaced meanwhile is skipped).
async fn put_vectors(
    client: &impl GenericClient,
    model: i32,
    chunk_ids: &[i64],
    blobs: &[Vec<u8>],
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            "INSERT INTO kb_vectors (chunk_id, model_id, vector, generation)
             SELECT u.id, $1::int4, u.vector, 0 FROM unnest($2::int8[], $3::bytea[]) AS u(id, vector)
             WHERE EXISTS (SELECT 1 FROM kb_chunks c WHERE c.id = u.id)
             ON CONFLICT (chunk_id) DO UPDATE SET model_id = excluded.model_id, vector = excluded.vector, generation = 0",
            &[&model, &chunk_ids, &blobs],
        )
        .await?;
    Ok(())
}

impl Store for PgStore {
    fn known_hashes(&self, source: &str) -> Result<HashMap<String, String>, KbError> {
        // What a sync compares with: the truth, not a copy a moment old.
        self.catch_up(true)?;
        self.copy.known_hashes(source)
    }

    fn apply(&self, changes: &[Change]) -> Result<(), KbError> {
        let changes = changes.to_vec();
        self.write(move |client| async move {
            let done = apply_changes(&**client, &changes).await;
            (client, done)
        })
    }

    fn begin(&self) -> Result<Box<dyn Writes + '_>, KbError> {
        Ok(Box::new(Session { store: self, client: Some(begin(&self.pg)?) }))
    }

    fn record_sync(&self, source: &str, error: Option<&str>, took: Duration) -> Result<(), KbError> {
        let (source, error) = (source.to_string(), error.map(str::to_string));
        let (now, failed, took) = (super::now_rfc3339(), i64::from(error.is_some()), took.as_millis() as i64);
        self.write(move |client| async move {
            let done = async {
            client
                .execute(
                    "INSERT INTO kb_sync_state (source, last_sync, last_error, syncs, failures, last_duration_ms, generation)
                     VALUES ($1::text, $2::text, $3::text, 1, $4::int8, $5::int8, 0)
                     ON CONFLICT (source) DO UPDATE SET last_sync = excluded.last_sync, last_error = excluded.last_error,
                         syncs = kb_sync_state.syncs + 1, failures = kb_sync_state.failures + excluded.failures,
                         last_duration_ms = excluded.last_duration_ms, generation = 0",
                    &[&source, &now, &error, &failed, &took],
                )
                .await?;
            // Tombstones older than a day go; a copy away longer than that starts over. Under
            // the knowledge base's lock first, as every writer takes it before kb_state.
            client.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || 'ctx kb'))", &[]).await?;
            client
                .execute(
                    &format!(
                        "WITH gone AS (DELETE FROM kb_deletions WHERE at < now() - interval '{TOMBSTONES_KEPT}' RETURNING generation)
                         UPDATE kb_state SET pruned_below = greatest(pruned_below, (SELECT max(generation) + 1 FROM gone))
                         WHERE EXISTS (SELECT 1 FROM gone)"
                    ),
                    &[],
                )
                .await?;
            Ok(())
            }
            .await;
            (client, done)
        })
    }

    fn connector_state(&self, source: &str) -> Result<connector_state::Saved, KbError> {
        self.catch_up(true)?;
        self.copy.connector_state(source)
    }

    fn stem(&self, word: &str) -> Result<String, KbError> {
        self.copy.stem(word)
    }

    fn prefix_root(&self, prefix: &str) -> Result<String, KbError> {
        self.copy.prefix_root(prefix)
    }

    fn keyword_candidates(
        &self,
        fts_query: &str,
        filter: &SearchFilter,
        limit: usize,
    ) -> Result<Vec<Candidate>, KbError> {
        self.read()?.keyword_candidates(fts_query, filter, limit)
    }

    fn keyword_candidates_by_fts5(
        &self,
        fts_query: &str,
        filter: &SearchFilter,
        limit: usize,
    ) -> Result<Vec<Candidate>, KbError> {
        self.read()?.keyword_candidates_by_fts5(fts_query, filter, limit)
    }

    fn semantic_candidates(
        &self,
        model: &str,
        query: &[f32],
        filter: &SearchFilter,
        limit: usize,
    ) -> Result<(Vec<Candidate>, vectors::Indexed), KbError> {
        self.read()?.semantic_candidates(model, query, filter, limit)
    }

    fn vectors_to_reuse(
        &self,
        document_ids: &[&str],
        model: &str,
        dims: usize,
    ) -> Result<HashMap<String, Vec<f32>>, KbError> {
        self.read()?.vectors_to_reuse(document_ids, model, dims)
    }

    fn unembedded(&self, model: &str, dims: usize, after: i64, limit: usize) -> Result<Vec<(i64, String)>, KbError> {
        self.read()?.unembedded(model, dims, after, limit)
    }

    fn put_vectors(&self, model: &str, dims: usize, rows: &[(i64, Vec<f32>)]) -> Result<(), KbError> {
        let model = model.to_string();
        let ids: Vec<i64> = rows.iter().map(|(id, _)| *id).collect();
        let blobs: Vec<Vec<u8>> = rows.iter().map(|(_, v)| vectors::to_blob(v)).collect();
        if rows.iter().any(|(_, v)| v.len() != dims) {
            return Err(KbError::Embed(format!("a vector is not of the model's {dims} dimensions")));
        }
        self.write(move |client| async move {
            let done = async {
                let id = model_id(&**client, &model, dims).await?;
                put_vectors(&**client, id, &ids, &blobs).await
            }
            .await;
            (client, done)
        })
    }

    fn coverage(&self) -> Result<vectors::Coverage, KbError> {
        self.read()?.coverage()
    }

    fn chunk_texts(&self, chunk_ids: &[i64]) -> Result<HashMap<i64, String>, KbError> {
        self.read()?.chunk_texts(chunk_ids)
    }

    fn document(&self, id: &str) -> Result<Option<types::Document>, KbError> {
        self.read()?.document(id)
    }

    fn sources(&self) -> Result<Vec<SourceRow>, KbError> {
        self.read()?.sources()
    }

    fn source_names(&self) -> Result<Vec<String>, KbError> {
        self.read()?.source_names()
    }

    fn stats(&self) -> Result<Stats, KbError> {
        self.read()?.stats()
    }

    fn claim_source(&self, source: &str, wait: Duration) -> Result<Claim, KbError> {
        let deadline = Instant::now() + wait;
        loop {
            // One try per connection checked out: a connection goes back when the lock is taken
            // by someone else, so waiting holds none of the pool.
            let key = source.to_string();
            let claimed = self
                .pg
                .run(move |client| async move {
                    let sql = "SELECT pg_try_advisory_lock(hashtext(current_schema() || 'ctx sync ' || $1::text))";
                    let got: bool = client.query_one(sql, &[&key]).await?.get(0);
                    Ok(got.then_some(client))
                })
                .map_err(KbError::Database)?;
            if let Some(client) = claimed {
                return Ok(Box::new(SourceClaim { client: Some(client), key: source.to_string() }));
            }
            if Instant::now() >= deadline {
                return Err(KbError::Database(DbError::Query(format!(
                    "another ctx is syncing {source} on the shared database and did not finish within {} s; what it \
                     writes is what searches see. Run the sync again later",
                    wait.as_secs()
                ))));
            }
            crate::db::blocking(|| std::thread::sleep(Duration::from_millis(250)));
        }
    }

    fn remove_source(&self, source: &str) -> Result<Removed, KbError> {
        let source = source.to_string();
        self.write(move |client| async move {
            let done = async {
            let row = client
                .query_one(
                    "SELECT (SELECT COUNT(*) FROM kb_documents WHERE source = $1::text),
                            (SELECT COUNT(*) FROM kb_chunks c JOIN kb_documents d ON d.id = c.document_id WHERE d.source = $1::text)",
                    &[&source],
                )
                .await?;
            let removed = Removed { documents: row.get(0), chunks: row.get(1) };
            client
                .execute(
                    "INSERT INTO kb_deletions (document_id, generation) SELECT id, 0 FROM kb_documents WHERE source = $1::text",
                    &[&source],
                )
                .await?;
            client.execute("DELETE FROM kb_documents WHERE source = $1::text", &[&source]).await?;
            client.execute("DELETE FROM kb_sync_state WHERE source = $1::text", &[&source]).await?;
            client.execute("DELETE FROM kb_connector_state WHERE source = $1::text", &[&source]).await?;
            Ok(removed)
            }
            .await;
            (client, done)
        })
    }
}

/// A source's sync lock: a session-level advisory lock on a connection kept out of the pool
/// until the sync ends (the lock goes with the connection should the process die).
struct SourceClaim {
    client: Option<Object>,
    key: String,
}

impl Drop for SourceClaim {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else { return };
        let key = std::mem::take(&mut self.key);
        let _ = crate::db::block(async move {
            let sql = "SELECT pg_advisory_unlock(hashtext(current_schema() || 'ctx sync ' || $1::text))";
            if client.query_one(sql, &[&key]).await.is_err() {
                drop(Object::take(client));
            }
            Ok(())
        });
    }
}

/// A sync's write session on PostgreSQL: one transaction on one pooled connection, stamped
/// and committed at [`Writes::commit`], rolled back if dropped first.
struct Session<'a> {
    store: &'a PgStore,
    client: Option<Object>,
}

impl Writes for Session<'_> {
    fn apply(&mut self, changes: &[Change]) -> Result<(), KbError> {
        let changes = changes.to_vec();
        let client =
            self.client.take().ok_or_else(|| KbError::Database(DbError::Query("the write session ended".into())))?;
        let (client, ()) = on(&self.store.pg, client, move |client| async move {
            let done = apply_changes(&**client, &changes).await;
            (client, done)
        })?;
        self.client = Some(client);
        Ok(())
    }

    fn commit(mut self: Box<Self>) -> Result<(), KbError> {
        let client =
            self.client.take().ok_or_else(|| KbError::Database(DbError::Query("the write session ended".into())))?;
        let (client, ()) = on(&self.store.pg, client, |client| async move {
            let done = finish(&client).await;
            (client, done)
        })?;
        drop(client);
        self.store.catch_up(true)
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            discard(client);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kb::chunk::Chunk;
    use crate::kb::store::NewDocument;

    fn migrated(db: &crate::db::testing::TestDb) -> Pg {
        let pg = db.pg();
        let migrating = pg.clone();
        crate::db::block(async move { crate::db::migrate::pg(&migrating, &[&PG]).await }).expect("migrations apply");
        pg
    }

    fn doc(source_id: &str, text: &str) -> Change {
        let id = crate::kb::document_id("filesystem:docs", source_id);
        Change::Upsert(Box::new(NewDocument {
            id,
            source: "filesystem:docs".into(),
            source_id: source_id.into(),
            title: "untitled".into(),
            body: text.into(),
            content_type: "text/markdown".into(),
            source_url: None,
            author: None,
            created_at: "2026-01-01T00:00:00Z".into(),
            updated_at: "2026-01-01T00:00:00Z".into(),
            metadata: serde_json::Value::Null,
            content_hash: format!("hash of {text}"),
            chunks: vec![Chunk { index: 0, text: text.into(), tokens: 4 }],
            vectors: None,
        }))
    }

    fn hits(store: &PgStore, word: &str) -> Vec<String> {
        let found = store.keyword_candidates(word, &SearchFilter::default(), 10).unwrap();
        found.into_iter().map(|c| c.source_id).collect()
    }

    /// Two replicas: each a store on the database with a copy of its own.
    fn replicas(db: &crate::db::testing::TestDb) -> (tempfile::TempDir, PgStore, PgStore) {
        let pg = migrated(db);
        let dir = tempfile::tempdir().unwrap();
        let a = PgStore::open(pg, &dir.path().join("a.sqlite"), Stemming::None).unwrap();
        let b = PgStore::open(db.pg(), &dir.path().join("b.sqlite"), Stemming::None).unwrap();
        (dir, a, b)
    }

    #[test]
    fn a_write_through_one_replica_is_read_through_another() {
        let Some(db) = crate::db::testing::database() else { return };
        let (_dir, a, b) = replicas(&db);
        a.apply(&[doc("walrus.md", "the walrus guards the pipeline"), doc("otter.md", "otters hold hands")]).unwrap();
        std::thread::sleep(FRESH);
        assert_eq!(hits(&b, "walrus"), vec!["walrus.md"]);
        // Changed and deleted through the second: the first follows.
        b.apply(&[
            doc("walrus.md", "the narwhal guards the pipeline"),
            Change::Delete { source: "filesystem:docs".into(), source_id: "otter.md".into() },
        ])
        .unwrap();
        std::thread::sleep(FRESH);
        assert!(hits(&a, "walrus").is_empty());
        assert_eq!(hits(&a, "narwhal"), vec!["walrus.md"]);
        assert!(hits(&a, "otters").is_empty());
        assert_eq!(a.stats().unwrap().documents, 1);
        // The same chunk ids on both copies: what one ranks, the other can quote.
        let on_a = a.keyword_candidates("narwhal", &SearchFilter::default(), 1).unwrap();
        let texts = b.chunk_texts(&[on_a[0].chunk_id]).unwrap();
        assert_eq!(texts[&on_a[0].chunk_id], "the narwhal guards the pipeline");
        // Sync records and removal of a source reach the other copy too.
        a.record_sync("filesystem:docs", None, Duration::from_millis(5)).unwrap();
        std::thread::sleep(FRESH);
        assert_eq!(b.sources().unwrap()[0].syncs, 1);
        assert_eq!(b.remove_source("filesystem:docs").unwrap(), Removed { documents: 1, chunks: 1 });
        std::thread::sleep(FRESH);
        assert!(a.sources().unwrap().is_empty());
        assert!(hits(&a, "narwhal").is_empty());
    }

    #[test]
    fn a_transaction_that_commits_later_is_not_missed_by_a_copy_that_caught_up_between() {
        let Some(db) = crate::db::testing::database() else { return };
        let (_dir, a, b) = replicas(&db);
        // A long sync starts first and commits last.
        let mut long = a.begin().unwrap();
        long.apply(&[doc("slow.md", "the slow capybara")]).unwrap();
        b.apply(&[doc("quick.md", "the quick heron")]).unwrap();
        std::thread::sleep(FRESH);
        assert_eq!(hits(&a, "heron"), vec!["quick.md"]);
        long.commit().unwrap();
        std::thread::sleep(FRESH);
        assert_eq!(hits(&b, "capybara"), vec!["slow.md"]);
        // A session dropped uncommitted leaves nothing, and its connection is usable again.
        let mut dropped = b.begin().unwrap();
        dropped.apply(&[doc("never.md", "a phantom okapi")]).unwrap();
        drop(dropped);
        std::thread::sleep(FRESH);
        assert!(hits(&a, "okapi").is_empty());
        a.apply(&[doc("after.md", "an okapi after all")]).unwrap();
        assert_eq!(hits(&a, "okapi"), vec!["after.md"]);
    }

    #[test]
    fn one_replica_syncs_a_source_at_a_time() {
        let Some(db) = crate::db::testing::database() else { return };
        let (_dir, a, b) = replicas(&db);
        let held = a.claim_source("filesystem:docs", Duration::ZERO).unwrap();
        let refused = b.claim_source("filesystem:docs", Duration::from_millis(300)).expect_err("held by a");
        assert!(refused.to_string().contains("another ctx is syncing filesystem:docs"), "{refused}");
        // Another source is free; the first is once a lets it go.
        drop(b.claim_source("git:handbook", Duration::ZERO).unwrap());
        drop(held);
        drop(b.claim_source("filesystem:docs", Duration::ZERO).unwrap());
    }

    #[test]
    fn two_processes_of_one_folder_share_its_copy_without_undoing_each_other() {
        let Some(db) = crate::db::testing::database() else { return };
        let pg = migrated(&db);
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("replica-kb.sqlite");
        // A server and a `ctx sync` beside it: two stores on one copy file.
        let server = PgStore::open(pg, &copy, Stemming::None).unwrap();
        let sync = PgStore::open(db.pg(), &copy, Stemming::None).unwrap();
        sync.apply(&[doc("a.md", "first walrus")]).unwrap();
        server.apply(&[doc("a.md", "second narwhal")]).unwrap();
        sync.apply(&[doc("b.md", "third okapi")]).unwrap();
        std::thread::sleep(FRESH);
        for store in [&server, &sync] {
            assert!(hits(store, "walrus").is_empty());
            assert_eq!(hits(store, "narwhal"), vec!["a.md"]);
            assert_eq!(hits(store, "okapi"), vec!["b.md"]);
        }
    }

    #[test]
    fn a_copy_of_another_database_is_made_afresh() {
        let (Some(first), Some(second)) = (crate::db::testing::database(), crate::db::testing::database()) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("copy.sqlite");
        let on_first = PgStore::open(migrated(&first), &copy, Stemming::None).unwrap();
        on_first.apply(&[doc("walrus.md", "the walrus")]).unwrap();
        drop(on_first);
        let on_second = PgStore::open(migrated(&second), &copy, Stemming::None).unwrap();
        assert!(hits(&on_second, "walrus").is_empty(), "nothing of the first database is left");
        assert_eq!(on_second.stats().unwrap().documents, 0);
    }
}
