//! Exact BM25 top-k for keyword queries, computed here from FTS5's own index data.
//!
//! FTS5's `bm25()` costs about 0.3 µs per matching row and scores every match before the top k
//! are taken, so a query of common words costs as much as the words are common. For MATCH
//! expressions of plain ASCII terms and term starts joined by AND or by OR (what
//! `query::fts_query` makes), this module reads each phrase's occurrences once from an
//! `fts5vocab` table, each row's token count from `chunks_fts_docsize`, and the row count and
//! total tokens from FTS5's averages record, applies the formula of FTS5's `bm25()` (k1 = 1.2,
//! b = 0.75, column weights 1.0 for text and 1.5 for title) and keeps each phrase's shares as a
//! posting list ([`topk::Postings`]). [`topk::top`] then finds the top k without scoring every
//! match. Same inputs, same formula, same order of additions: the scores are the bits
//! `bm25(chunks_fts, 1.0, 1.5)` gives.
//!
//! Everything read is cached per store and dropped when the store's generation (bumped by every
//! write to chunks, not by vectors written alone; see `store_meta`) changes, checked inside the same read transaction as the query. The
//! posting lists are bounded by [`CACHE_BYTES`], least recently used first out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension};

use super::topk::{self, Join, Postings};

/// The weights `bm25(chunks_fts, ...)` is called with, by column.
const TEXT_WEIGHT: f64 = 1.0;
const TITLE_WEIGHT: f64 = 1.5;
const K1: f64 = 1.2;
const B: f64 = 0.75;

/// Posting lists kept at most, in bytes (16 per match: a word in half of a 1M-chunk index
/// takes about 8 MB).
pub const CACHE_BYTES: usize = 256 << 20;

/// Posting lists one query may hold at most, cached or not; past it, FTS5 ranks the query. Eight
/// queries at once may each hold this much beside the cache.
pub const QUERY_BYTES: usize = 64 << 20;

/// Phrases one query may have; more go to FTS5.
pub const MAX_PHRASES: usize = 12;

/// Lists kept at most, whatever their bytes.
const MAX_LISTS: usize = 4096;

/// What a kept list costs beside its postings: its key and the map's entry.
const ENTRY_BYTES: usize = 128;

/// The fts5vocab table each connection creates for itself (a temp table: no migration).
pub const VOCAB_DDL: &str =
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.chunks_vocab USING fts5vocab(main, 'chunks_fts', 'instance')";

/// One phrase as the index stores it: a term (stemmed when the index stems), or a term's start.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IndexPhrase {
    pub term: String,
    pub prefix: bool,
}

/// The filters of a search, as the cache applies them.
#[derive(Clone, Copy, Default)]
pub struct Filter<'a> {
    pub sources: Option<&'a [String]>,
    pub since: Option<&'a str>,
}

/// What one store generation's data gives every query.
struct Cache {
    generation: i64,
    /// Tokens per chunk (text and title together), indexed by chunk id; 0 for no chunk. Inner
    /// `None`: the ids are too sparse for arrays by id, and FTS5 ranks this index.
    #[allow(clippy::option_option)]
    lengths: Option<Option<Arc<Vec<u32>>>>,
    /// Each chunk's source and date, read for the first filtered query.
    attributes: Option<Arc<Attributes>>,
    lists: HashMap<IndexPhrase, Cached>,
    bytes: usize,
    clock: u64,
}

struct Cached {
    postings: Arc<Postings>,
    used: u64,
}

/// Each chunk's source and `updated_at`, by chunk id, for filters.
struct Attributes {
    /// Index into `sources`; `u32::MAX` for no chunk.
    source: Vec<u32>,
    sources: Vec<String>,
    /// Rank of the chunk's `updated_at` among `dates` (sorted, distinct).
    date: Vec<u32>,
    dates: Vec<String>,
}

/// The caches of keyword ranking, shared by the store's connections.
pub struct TermRanker {
    cache: Mutex<Cache>,
}

impl Default for TermRanker {
    fn default() -> Self {
        TermRanker {
            cache: Mutex::new(Cache {
                generation: i64::MIN,
                lengths: None,
                attributes: None,
                lists: HashMap::new(),
                bytes: 0,
                clock: 0,
            }),
        }
    }
}

impl TermRanker {
    /// The `limit` best chunks for `phrases` (in the index's form, in query order) joined by
    /// `join` among chunks `filter` keeps, as `(chunk id, score)`, best first, ties by lower id.
    /// `None` when the lists cannot rank it (chunk ids too sparse for arrays by id, or over
    /// [`QUERY_BYTES`] of lists for this one query): the caller asks FTS5. Runs in one read
    /// transaction on `conn`.
    pub fn top(
        &self,
        conn: &Connection,
        phrases: &[IndexPhrase],
        join: Join,
        filter: Filter,
        limit: usize,
    ) -> rusqlite::Result<Option<Vec<(i64, f64)>>> {
        conn.prepare_cached("BEGIN")?.execute([])?;
        let result = self.top_in_transaction(conn, phrases, join, filter, limit);
        // The query's own error matters more than the end of a read transaction.
        let end = conn.prepare_cached("COMMIT").and_then(|mut s| s.execute([]));
        let top = result?;
        end?;
        Ok(top)
    }

    fn top_in_transaction(
        &self,
        conn: &Connection,
        phrases: &[IndexPhrase],
        join: Join,
        filter: Filter,
        limit: usize,
    ) -> rusqlite::Result<Option<Vec<(i64, f64)>>> {
        // The walk checks every list for each chunk it meets: past a dozen words (a pasted
        // paragraph), FTS5's merge is the cheaper way.
        if phrases.len() > MAX_PHRASES {
            return Ok(None);
        }
        let generation: i64 = conn
            .prepare_cached("SELECT value FROM store_meta WHERE key = 'generation'")?
            .query_row([], |r| r.get(0))
            .optional()?
            .unwrap_or(0);
        let Some((rows, tokens)) = averages(conn)? else { return Ok(Some(Vec::new())) };
        let lengths =
            self.cached(generation, |c| c.lengths.clone(), || lengths(conn, rows), |c, v| c.lengths = Some(v))?;
        let Some(lengths) = lengths else { return Ok(None) };
        let avgdl = tokens as f64 / rows as f64;
        let mut lists = Vec::with_capacity(phrases.len());
        // Bytes of the lists this query holds, cached or read now.
        let mut held = 0usize;
        for phrase in phrases {
            let cached = {
                let mut cache = self.current(generation);
                cache.clock += 1;
                let clock = cache.clock;
                cache.lists.get_mut(phrase).map(|c| {
                    c.used = clock;
                    Arc::clone(&c.postings)
                })
            };
            let postings = match cached {
                Some(postings) => postings,
                None => {
                    let Some(loaded) = load(conn, phrase, rows, avgdl, &lengths)? else { return Ok(None) };
                    let loaded = Arc::new(loaded);
                    // An empty list costs a lookup to read again: keeping it would let queries
                    // of made-up words fill the cache with entries that weigh nothing.
                    if !loaded.is_empty() {
                        self.keep(generation, phrase, &loaded);
                    }
                    loaded
                }
            };
            held += postings.bytes();
            if join == Join::All && postings.is_empty() {
                return Ok(Some(Vec::new()));
            }
            lists.push(postings);
            // Many common words in one query: FTS5 streams them, where lists would all be held
            // at once.
            if held > QUERY_BYTES {
                return Ok(None);
            }
        }
        let refs: Vec<&Postings> = lists.iter().map(Arc::as_ref).collect();
        let top = if filter.sources.is_none() && filter.since.is_none() {
            topk::top(&refs, join, limit, &|_| true)
        } else {
            let attributes =
                self.cached(generation, |c| c.attributes.clone(), || attributes(conn), |c, v| c.attributes = Some(v))?;
            let keep = attributes.keeper(filter);
            topk::top(&refs, join, limit, &keep)
        };
        // Out of time: reported as SQLite reports an interrupted query, which `kb::budget`
        // callers know to run again where they may block.
        let top = top.ok_or_else(|| {
            rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_INTERRUPT), None)
        })?;
        Ok(Some(top.into_iter().map(|(id, score)| (i64::from(id), score)).collect()))
    }

    /// The cache, emptied first if it holds another generation's data.
    fn current(&self, generation: i64) -> std::sync::MutexGuard<'_, Cache> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.generation != generation {
            cache.generation = generation;
            cache.lengths = None;
            cache.attributes = None;
            cache.lists.clear();
            cache.bytes = 0;
        }
        cache
    }

    /// A per-generation value: cached, or read (outside the lock: reads can take a while) and
    /// kept unless the generation moved meanwhile.
    fn cached<T: Clone>(
        &self,
        generation: i64,
        get: impl Fn(&Cache) -> Option<T>,
        read: impl FnOnce() -> rusqlite::Result<T>,
        put: impl FnOnce(&mut Cache, T),
    ) -> rusqlite::Result<T> {
        if let Some(value) = get(&self.current(generation)) {
            return Ok(value);
        }
        let value = read()?;
        let mut cache = self.current(generation);
        put(&mut cache, value.clone());
        Ok(value)
    }

    /// Keeps a loaded list, dropping the least recently used ones past [`CACHE_BYTES`].
    fn keep(&self, generation: i64, phrase: &IndexPhrase, postings: &Arc<Postings>) {
        let mut cache = self.current(generation);
        cache.clock += 1;
        let used = cache.clock;
        let fresh = Cached { postings: Arc::clone(postings), used };
        let weight = |phrase: &IndexPhrase, postings: &Postings| postings.bytes() + phrase.term.len() + ENTRY_BYTES;
        cache.bytes += weight(phrase, postings);
        if let Some(old) = cache.lists.insert(phrase.clone(), fresh) {
            cache.bytes -= weight(phrase, &old.postings);
        }
        while (cache.bytes > CACHE_BYTES || cache.lists.len() > MAX_LISTS) && cache.lists.len() > 1 {
            let Some(oldest) = cache.lists.iter().min_by_key(|(_, c)| c.used).map(|(k, _)| k.clone()) else { break };
            if let Some(gone) = cache.lists.remove(&oldest) {
                cache.bytes -= weight(&oldest, &gone.postings);
            }
        }
    }
}

impl Attributes {
    fn keeper<'a>(&'a self, filter: Filter<'a>) -> impl Fn(u32) -> bool + 'a {
        let allowed: Option<Vec<bool>> =
            filter.sources.map(|wanted| self.sources.iter().map(|s| wanted.contains(s)).collect());
        // `updated_at >= since`, as SQLite compares text: the first date rank not below it.
        let from = filter.since.map(|since| self.dates.partition_point(|d| d.as_str() < since) as u32);
        move |id: u32| {
            let at = id as usize;
            let source = self.source.get(at).copied().unwrap_or(u32::MAX);
            if source == u32::MAX {
                return false;
            }
            let source_ok = allowed.as_ref().is_none_or(|a| a[source as usize]);
            source_ok && from.is_none_or(|from| self.date[at] >= from)
        }
    }
}

/// A phrase's posting list: each matching chunk with its share of the score. `None` when a
/// chunk id does not fit a `u32`.
fn load(
    conn: &Connection,
    phrase: &IndexPhrase,
    rows: u64,
    avgdl: f64,
    lengths: &[u32],
) -> rusqlite::Result<Option<Postings>> {
    // Each matching chunk with its weighted count of occurrences.
    let mut hits: Vec<(i64, f64)> = Vec::new();
    let weight = |col: rusqlite::types::ValueRef| -> rusqlite::Result<f64> {
        Ok(match col.as_str()? {
            "title" => TITLE_WEIGHT,
            _ => TEXT_WEIGHT,
        })
    };
    if phrase.prefix {
        // Every term that starts with the phrase, in term order, summed per chunk in an array by
        // chunk id: memory follows the number of chunks, not of occurrences (`"a"*` can match a
        // good part of the index). The sums are of 1.0 and 1.5, exact in any order.
        // The terms are ASCII, so the next string past every one starting with it ends in the
        // last byte plus one (text compares bytewise).
        let mut end = phrase.term.clone().into_bytes();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let end = String::from_utf8(end).unwrap_or_default();
        let mut freq = vec![0.0f64; lengths.len()];
        let mut stmt = conn.prepare_cached("SELECT doc, col FROM temp.chunks_vocab WHERE term >= ?1 AND term < ?2")?;
        let mut cursor = stmt.query([&phrase.term, &end])?;
        while let Some(row) = cursor.next()? {
            let doc: i64 = row.get(0)?;
            // Every indexed chunk has a size row, so its id is within `lengths`.
            let Some(slot) = usize::try_from(doc).ok().and_then(|at| freq.get_mut(at)) else { return Ok(None) };
            *slot += weight(row.get_ref(1)?)?;
        }
        hits = freq.iter().enumerate().filter(|(_, f)| **f > 0.0).map(|(doc, f)| (doc as i64, *f)).collect();
    } else {
        // Rows come ordered by chunk id.
        let mut stmt = conn.prepare_cached("SELECT doc, col FROM temp.chunks_vocab WHERE term = ?1")?;
        let mut cursor = stmt.query([&phrase.term])?;
        while let Some(row) = cursor.next()? {
            let doc: i64 = row.get(0)?;
            let w = weight(row.get_ref(1)?)?;
            match hits.last_mut() {
                Some((last, freq)) if *last == doc => *freq += w,
                _ => hits.push((doc, w)),
            }
        }
    }
    let n = rows as f64;
    let hit_count = hits.len() as f64;
    let idf = match ((n - hit_count + 0.5) / (hit_count + 0.5)).ln() {
        idf if idf <= 0.0 => 1e-6,
        idf => idf,
    };
    let mut ids = Vec::with_capacity(hits.len());
    let mut shares = Vec::with_capacity(hits.len());
    for (doc, freq) in hits {
        let Ok(id) = u32::try_from(doc) else { return Ok(None) };
        let d = lengths.get(id as usize).copied().unwrap_or(0) as f64;
        ids.push(id);
        shares.push(idf * ((freq * (K1 + 1.0)) / (freq + K1 * (1.0 - B + B * d / avgdl))));
    }
    Ok(Some(Postings::new(ids, shares)))
}

/// Token counts of every indexed chunk by id, for an index of `rows` chunks. `None` when the ids
/// are too sparse for arrays by id (far past the number of chunks, after years of churn, or an id
/// past `u32`): FTS5 then ranks every query.
fn lengths(conn: &Connection, rows: u64) -> rusqlite::Result<Option<Arc<Vec<u32>>>> {
    let most = rows.saturating_mul(4).saturating_add(1 << 16).min(u32::MAX as u64) as usize;
    let mut by_id: Vec<u32> = Vec::new();
    let mut stmt = conn.prepare_cached("SELECT id, sz FROM chunks_fts_docsize")?;
    let mut cursor = stmt.query([])?;
    while let Some(row) = cursor.next()? {
        let id: i64 = row.get(0)?;
        let Some(at) = usize::try_from(id).ok().filter(|at| *at < most) else { return Ok(None) };
        let size = varints(row.get_ref(1)?.as_blob()?).iter().sum::<u64>().min(u32::MAX as u64) as u32;
        if at >= by_id.len() {
            by_id.resize(at + 1, 0);
        }
        by_id[at] = size;
    }
    Ok(Some(Arc::new(by_id)))
}

/// Each chunk's source and date (only read when a filter is used).
fn attributes(conn: &Connection) -> rusqlite::Result<Arc<Attributes>> {
    let mut names: HashMap<String, u32> = HashMap::new();
    let mut days: HashMap<String, u32> = HashMap::new();
    let mut rows: Vec<(usize, u32, u32)> = Vec::new();
    let mut stmt = conn.prepare_cached("SELECT id, source, updated_at FROM chunks")?;
    let mut cursor = stmt.query([])?;
    while let Some(row) = cursor.next()? {
        let Ok(id) = u32::try_from(row.get::<_, i64>(0)?) else { continue };
        let next = names.len() as u32;
        let source = *names.entry(row.get(1)?).or_insert(next);
        let next = days.len() as u32;
        let day = *days.entry(row.get(2)?).or_insert(next);
        rows.push((id as usize, source, day));
    }
    let mut sources = vec![String::new(); names.len()];
    for (name, at) in names {
        sources[at as usize] = name;
    }
    let mut dates: Vec<(String, u32)> = days.into_iter().collect();
    dates.sort();
    // First-seen number to sorted rank.
    let mut rank = vec![0u32; dates.len()];
    for (sorted, (_, seen)) in dates.iter().enumerate() {
        rank[*seen as usize] = sorted as u32;
    }
    let len = rows.iter().map(|(id, _, _)| id + 1).max().unwrap_or(0);
    let (mut source, mut date) = (vec![u32::MAX; len], vec![0u32; len]);
    for (id, s, d) in rows {
        source[id] = s;
        date[id] = rank[d as usize];
    }
    Ok(Arc::new(Attributes { source, sources, date, dates: dates.into_iter().map(|(d, _)| d).collect() }))
}

/// FTS5's row count and total token count (all columns), from its averages record: what
/// `bm25()` itself uses. `None` for an empty index.
fn averages(conn: &Connection) -> rusqlite::Result<Option<(u64, u64)>> {
    let blob: Option<Vec<u8>> = conn
        .prepare_cached("SELECT block FROM chunks_fts_data WHERE id = 1")?
        .query_row([], |r| r.get(0))
        .optional()?;
    let Some(blob) = blob else { return Ok(None) };
    let values = varints(&blob);
    let rows = values.first().copied().unwrap_or(0);
    let tokens = values.iter().skip(1).sum();
    Ok((rows > 0).then_some((rows, tokens)))
}

/// Decodes a run of SQLite varints (FTS5 writes its sizes and averages this way).
fn varints(mut bytes: &[u8]) -> Vec<u64> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let mut value: u64 = 0;
        let mut used = 0;
        for (i, &byte) in bytes.iter().enumerate() {
            used = i + 1;
            if i == 8 {
                value = (value << 8) | byte as u64;
                break;
            }
            value = (value << 7) | (byte & 0x7f) as u64;
            if byte & 0x80 == 0 {
                break;
            }
        }
        out.push(value);
        bytes = &bytes[used..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_decode_like_sqlite() {
        assert_eq!(varints(&[0x05]), vec![5]);
        assert_eq!(varints(&[0x81, 0x00, 0x7f]), vec![128, 127]);
        assert_eq!(varints(&[0x82, 0x80, 0x01]), vec![(2 << 14) | 1]);
    }
}
