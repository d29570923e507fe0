//! Exact BM25 for one-term queries, computed here from FTS5's own index data.
//!
//! FTS5's `bm25()` costs about 0.3 µs per matching row, and a common term matches a quarter of
//! all chunks, so one-word searches dominate the cost of a search mix. For a single plain term
//! this module reads the term's occurrences from an `fts5vocab` table, each row's token count
//! from a cache of `chunks_fts_docsize`, and the row count and total tokens from FTS5's
//! averages record, then applies the formula of FTS5's `bm25()` (k1 = 1.2, b = 0.75, column
//! weights 1.0 for text and 1.5 for title). Same inputs, same formula: the scores are the ones
//! `bm25(chunks_fts, 1.0, 1.5)` gives (`benches/kb.rs` prints both timings).
//!
//! The token counts are cached per store and reloaded when the store's generation (bumped by
//! every write, see `store_meta`) changes, inside the same read transaction as the query.

use std::sync::{Arc, RwLock};

use rusqlite::{Connection, OptionalExtension};

/// The weights `bm25(chunks_fts, ...)` is called with, by column.
const TEXT_WEIGHT: f64 = 1.0;
const TITLE_WEIGHT: f64 = 1.5;
const K1: f64 = 1.2;
const B: f64 = 0.75;

/// The fts5vocab table each connection creates for itself (a temp table: no migration).
pub const VOCAB_DDL: &str =
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.chunks_vocab USING fts5vocab(main, 'chunks_fts', 'instance')";

/// Token counts of every indexed chunk, as of one store generation.
struct Lengths {
    generation: i64,
    /// Tokens per chunk (text and title together), indexed by chunk id; 0 for no chunk.
    by_id: Vec<u32>,
}

/// The cache of token counts, shared by the store's connections.
#[derive(Default)]
pub struct TermRanker {
    lengths: RwLock<Option<Arc<Lengths>>>,
}

impl TermRanker {
    /// The `limit` best chunks for one plain `term` (already in the index's folded form) as
    /// `(chunk id, score)`, best first, ties by id. Runs in one read transaction on `conn`.
    pub fn top(&self, conn: &Connection, term: &str, limit: usize) -> rusqlite::Result<Vec<(i64, f64)>> {
        conn.prepare_cached("BEGIN")?.execute([])?;
        let result = self.top_in_transaction(conn, term, limit);
        // The query's own error matters more than the end of a read transaction.
        let end = conn.prepare_cached("COMMIT").and_then(|mut s| s.execute([]));
        let top = result?;
        end?;
        Ok(top)
    }

    fn top_in_transaction(&self, conn: &Connection, term: &str, limit: usize) -> rusqlite::Result<Vec<(i64, f64)>> {
        let Some((rows, tokens)) = averages(conn)? else { return Ok(Vec::new()) };
        let lengths = self.lengths(conn)?;
        // Each matching chunk with its weighted term frequency; rows come ordered by chunk id.
        let mut hits: Vec<(i64, f64)> = Vec::new();
        let mut stmt = conn.prepare_cached("SELECT doc, col FROM temp.chunks_vocab WHERE term = ?1")?;
        let mut cursor = stmt.query([term])?;
        while let Some(row) = cursor.next()? {
            let doc: i64 = row.get(0)?;
            let weight = match row.get_ref(1)?.as_str()? {
                "title" => TITLE_WEIGHT,
                _ => TEXT_WEIGHT,
            };
            match hits.last_mut() {
                Some((last, freq)) if *last == doc => *freq += weight,
                _ => hits.push((doc, weight)),
            }
        }
        let n = rows as f64;
        let hit_count = hits.len() as f64;
        let idf = match ((n - hit_count + 0.5) / (hit_count + 0.5)).ln() {
            idf if idf <= 0.0 => 1e-6,
            idf => idf,
        };
        let avgdl = tokens as f64 / n;
        let mut scored: Vec<(i64, f64)> = hits
            .into_iter()
            .map(|(doc, freq)| {
                let d = lengths.by_id.get(doc as usize).copied().unwrap_or(0) as f64;
                (doc, idf * ((freq * (K1 + 1.0)) / (freq + K1 * (1.0 - B + B * d / avgdl))))
            })
            .collect();
        let better = |a: &(i64, f64), b: &(i64, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if scored.len() > limit {
            scored.select_nth_unstable_by(limit, better);
            scored.truncate(limit);
        }
        scored.sort_by(better);
        Ok(scored)
    }

    /// The cached token counts, reloaded if the store has changed since they were read.
    fn lengths(&self, conn: &Connection) -> rusqlite::Result<Arc<Lengths>> {
        let generation: i64 = conn
            .prepare_cached("SELECT value FROM store_meta WHERE key = 'generation'")?
            .query_row([], |r| r.get(0))
            .optional()?
            .unwrap_or(0);
        if let Some(cached) = self.lengths.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
            if cached.generation == generation {
                return Ok(Arc::clone(cached));
            }
        }
        let mut by_id: Vec<u32> = Vec::new();
        let mut stmt = conn.prepare_cached("SELECT id, sz FROM chunks_fts_docsize")?;
        let mut cursor = stmt.query([])?;
        while let Some(row) = cursor.next()? {
            let id: i64 = row.get(0)?;
            let Ok(at) = usize::try_from(id) else { continue };
            let size = varints(row.get_ref(1)?.as_blob()?).iter().sum::<u64>().min(u32::MAX as u64) as u32;
            if at >= by_id.len() {
                by_id.resize(at + 1, 0);
            }
            by_id[at] = size;
        }
        let fresh = Arc::new(Lengths { generation, by_id });
        *self.lengths.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&fresh));
        Ok(fresh)
    }
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

/// The term of a MATCH expression that is one plain quoted ASCII term (`"deploy"`), lower-cased
/// the way the `unicode61` tokenizer folds it; `None` for anything else (several terms, a
/// prefix, non-ASCII text whose folding only FTS5 knows).
pub fn single_term(fts: &str) -> Option<String> {
    let inner = fts.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.is_empty() && inner.bytes().all(|b| b.is_ascii_alphanumeric())).then(|| inner.to_ascii_lowercase())
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

    #[test]
    fn only_one_plain_ascii_term_qualifies() {
        assert_eq!(single_term("\"Deploy\"").as_deref(), Some("deploy"));
        assert_eq!(single_term("\"deploy\" AND \"rollback\""), None);
        assert_eq!(single_term("\"depl\"*"), None);
        assert_eq!(single_term("\"café\""), None);
        assert_eq!(single_term("\"\""), None);
    }
}
