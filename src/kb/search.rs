//! Search over the store: mode handling, source filters, limits, and grouping by document.

use std::collections::HashMap;
use std::sync::Arc;

use super::query::fts_query;
use super::snippet::snippet;
use super::store::{Candidate, SearchFilter, Store};
use super::{normalize_date, KbError};
use crate::config::Config;
use crate::embed::Embedder;
use crate::types::{HitExplain, ListRank, SearchExplain, SearchHit, SearchMode, SearchRequest, SearchResponse};

/// The most candidates one search ranks before grouping.
const MAX_CANDIDATES: usize = 5000;

/// Runs `request` against `store`. `known_sources` resolves the `source` filter; `embedder`
/// (or why there is none) serves semantic and hybrid search.
pub fn search(
    store: &dyn Store,
    config: &Config,
    known_sources: &[String],
    embedder: Result<Option<Arc<dyn Embedder>>, KbError>,
    request: &SearchRequest,
) -> Result<SearchResponse, KbError> {
    let retrieval = &config.spec.retrieval;
    let requested = request.mode.unwrap_or(SearchMode::Keyword);
    let mut notes = Vec::new();
    let limit = match request.limit {
        None => retrieval.default_limit as usize,
        Some(n) if n >= 1 && n <= retrieval.max_limit => n as usize,
        Some(n) => return Err(KbError::BadLimit { given: n as i64, max: retrieval.max_limit as i64 }),
    };
    let query = fts_query(request.query.as_str());
    let embedder = match (requested, embedder) {
        (SearchMode::Keyword, _) => None,
        (_, Ok(Some(e))) => Some(e),
        (SearchMode::Semantic, Ok(None)) => return Err(KbError::SemanticUnavailable),
        (SearchMode::Semantic, Err(e)) => return Err(e),
        (_, Ok(None)) => {
            notes.push("hybrid search fell back to keyword: no embedding provider is configured ([embedding] provider = \"disabled\")".to_string());
            None
        }
        (_, Err(e)) => {
            notes.push(format!("hybrid search fell back to keyword: {e}"));
            None
        }
    };
    let mode = match (&embedder, requested) {
        (None, _) => SearchMode::Keyword,
        (Some(_), m) => m,
    };
    // Only keyword search needs a word to match: the vector modes rank by the whole text.
    if query.is_none() && mode == SearchMode::Keyword {
        return Err(KbError::EmptyQuery);
    }
    let filter = SearchFilter {
        sources: match &request.source {
            Some(wanted) => Some(resolve_sources(wanted.as_str(), known_sources)?),
            None => None,
        },
        since: request
            .since
            .as_deref()
            .map(|d| normalize_date(d).ok_or_else(|| KbError::BadDate(d.to_string())))
            .transpose()?,
    };
    let per_doc = retrieval.max_chunks_per_doc as usize;
    let mut fts = query.as_ref().map(|q| q.all.clone()).unwrap_or_default();
    let (hits, candidates, ranks) = match (&embedder, mode) {
        (Some(embedder), SearchMode::Semantic) => {
            let vector = query_vector(embedder.as_ref(), request.query.as_str())?;
            let (hits, candidates) = ranked(
                |window| semantic_list(store, embedder.as_ref(), &vector, &filter, window, &mut notes),
                limit,
                per_doc,
            )?;
            let ranks = hits.iter().enumerate().map(|(i, c)| (c.chunk_id, Ranks::semantic(i, c.score))).collect();
            (hits, candidates, ranks)
        }
        (Some(embedder), _) => {
            let vector = query_vector(embedder.as_ref(), request.query.as_str())?;
            // Fusion takes the any-word ranking: requiring every word drops most candidates a
            // paraphrase needs, and the vector list is there to rank them.
            match &query {
                Some(query) => fts = query.any.clone().unwrap_or_else(|| query.all.clone()),
                None => {
                    notes.push("the query has no word to match, so hybrid ranks by the semantic list alone".to_string())
                }
            }
            let (k, weight) = (retrieval.rrf_k as f64, retrieval.hybrid_weight);
            // Widened, like a single list, when grouping by document leaves the page short
            // (long documents fill a window of chunks) and a list has more to give.
            let mut window = FUSION_WINDOW.max(limit * per_doc);
            loop {
                let keyword =
                    if fts.is_empty() { Vec::new() } else { store.keyword_candidates(&fts, &filter, window)? };
                let semantic = semantic_list(store, embedder.as_ref(), &vector, &filter, window, &mut notes)?;
                let (fused, ranks) = fuse(&keyword, &semantic, k, weight);
                let hits = group(&fused, per_doc, limit);
                let more = keyword.len() == window || semantic.len() == window;
                if hits.len() == limit || !more || window == MAX_CANDIDATES {
                    break (hits, keyword.len() + semantic.len(), ranks);
                }
                window = (window * 4).min(MAX_CANDIDATES);
            }
        }
        (None, _) => {
            let query = query.as_ref().ok_or(KbError::EmptyQuery)?;
            let (mut hits, mut candidates) =
                ranked(|window| store.keyword_candidates(&fts, &filter, window), limit, per_doc)?;
            if hits.is_empty() {
                if let Some(any) = &query.any {
                    notes.push("no chunk matched every term, so results match any of them".to_string());
                    fts = any.clone();
                    (hits, candidates) =
                        ranked(|window| store.keyword_candidates(&fts, &filter, window), limit, per_doc)?;
                }
            }
            let ranks = hits.iter().enumerate().map(|(i, c)| (c.chunk_id, Ranks::keyword(i, c.score))).collect();
            (hits, candidates, ranks)
        }
    };
    let terms: &[(String, bool)] = query.as_ref().map(|q| &q.terms[..]).unwrap_or(&[]);
    let texts = store.chunk_texts(&hits.iter().map(|c| c.chunk_id).collect::<Vec<_>>())?;
    let results = hits
        .into_iter()
        .map(|c| SearchHit {
            snippet: texts.get(&c.chunk_id).map(|text| snippet(text, terms)).unwrap_or_default(),
            explain: request.explain.then(|| ranks.get(&c.chunk_id).map(Ranks::explain)).flatten(),
            id: c.document_id,
            chunk_index: c.chunk_index as u64,
            score: c.score.max(0.0),
            title: c.title,
            source: c.source,
            source_url: c.source_url,
            updated_at: c.updated_at,
        })
        .collect();
    let hybrid = mode == SearchMode::Hybrid;
    let explain = request.explain.then(|| SearchExplain {
        requested_mode: requested,
        mode,
        fts_query: fts.clone(),
        candidates: candidates as u64,
        notes: notes.clone(),
        model: embedder.as_ref().map(|e| e.name().to_string()),
        rrf_k: hybrid.then_some(retrieval.rrf_k),
        hybrid_weight: hybrid.then_some(retrieval.hybrid_weight),
    });
    Ok(SearchResponse { results, mode, explain })
}

/// Candidates each list gives hybrid fusion (or more, for a large page).
pub const FUSION_WINDOW: usize = 100;

/// The query's vector. A query of no known word has the zero vector, which ranks nothing.
fn query_vector(embedder: &dyn Embedder, text: &str) -> Result<Vec<f32>, KbError> {
    let mut vectors = embedder.embed(&[text]).map_err(|e| KbError::Embed(e.to_string()))?;
    Ok(vectors.pop().unwrap_or_default())
}

/// The semantic list, with a note when part of the index has no vectors of this model yet.
fn semantic_list(
    store: &dyn Store,
    embedder: &dyn Embedder,
    vector: &[f32],
    filter: &SearchFilter,
    window: usize,
    notes: &mut Vec<String>,
) -> Result<Vec<Candidate>, KbError> {
    // A text of no word the model knows has no direction: it is near nothing.
    if vector.iter().all(|x| *x == 0.0) {
        let note = "the query has no word the embedding model knows, so the semantic list is empty".to_string();
        if !notes.contains(&note) {
            notes.push(note);
        }
        return Ok(Vec::new());
    }
    let (found, coverage) = store.semantic_candidates(embedder.name(), vector, filter, window)?;
    let note = match (coverage.vectors, coverage.chunks) {
        (0, chunks) if chunks > 0 => Some(format!(
            "no chunk has a vector of {} yet, so semantic search finds nothing: run `ctx embed` (or `ctx sync`)",
            embedder.name()
        )),
        (indexed, chunks) if indexed < chunks => Some(format!(
            "only {indexed} of {chunks} chunks have vectors of {}: run `ctx embed` to add the rest",
            embedder.name()
        )),
        _ => None,
    };
    if let Some(note) = note {
        if !notes.contains(&note) {
            notes.push(note);
        }
    }
    Ok(found)
}

/// A hit's place (from 1) and raw score in each list.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Ranks {
    pub keyword: Option<(usize, f64)>,
    pub semantic: Option<(usize, f64)>,
}

impl Ranks {
    fn keyword(at: usize, score: f64) -> Ranks {
        Ranks { keyword: Some((at + 1, score)), semantic: None }
    }

    fn semantic(at: usize, score: f64) -> Ranks {
        Ranks { keyword: None, semantic: Some((at + 1, score)) }
    }

    fn explain(&self) -> HitExplain {
        let rank = |r: Option<(usize, f64)>| r.map(|(rank, score)| ListRank { rank: rank as u64, score });
        HitExplain { keyword: rank(self.keyword), semantic: rank(self.semantic) }
    }
}

/// Weighted reciprocal rank fusion, per chunk: a chunk at rank r (from 1) of a list adds that
/// list's weight / (k + r). Ranks, not scores, are fused: BM25 and cosine are on scales that
/// no normalisation makes comparable, and a rank cannot make a lone weak hit look perfect.
/// Ties go to the lower chunk id. Returns the fused list, best first, and each chunk's ranks.
pub fn fuse(
    keyword: &[Candidate],
    semantic: &[Candidate],
    k: f64,
    weight: f64,
) -> (Vec<Candidate>, HashMap<i64, Ranks>) {
    let mut ranks: HashMap<i64, Ranks> = HashMap::new();
    let mut fused: HashMap<i64, (f64, &Candidate)> = HashMap::new();
    for (list, w, is_keyword) in [(keyword, 1.0 - weight, true), (semantic, weight, false)] {
        for (i, c) in list.iter().enumerate() {
            let entry = ranks.entry(c.chunk_id).or_default();
            if is_keyword {
                entry.keyword = Some((i + 1, c.score));
            } else {
                entry.semantic = Some((i + 1, c.score));
            }
            fused.entry(c.chunk_id).or_insert((0.0, c)).0 += w / (k + (i + 1) as f64);
        }
    }
    let mut out: Vec<Candidate> = fused.into_values().map(|(score, c)| Candidate { score, ..c.clone() }).collect();
    out.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.chunk_id.cmp(&b.chunk_id)));
    (out, ranks)
}

/// The top `limit` chunks of a ranked list (`list(window)` gives its first `window`), at most
/// `per_doc` per document, and how many candidates were ranked.
fn ranked(
    mut list: impl FnMut(usize) -> Result<Vec<Candidate>, KbError>,
    limit: usize,
    per_doc: usize,
) -> Result<(Vec<Candidate>, usize), KbError> {
    let mut window = (limit * per_doc.max(3)).clamp(30, MAX_CANDIDATES);
    loop {
        let candidates = list(window)?;
        let exhausted = candidates.len() < window || window == MAX_CANDIDATES;
        let hits = group(&candidates, per_doc, limit);
        if hits.len() == limit || exhausted {
            return Ok((hits, candidates.len()));
        }
        window = (window * 4).min(MAX_CANDIDATES);
    }
}

/// Keeps candidates in rank order, at most `per_doc` per document, up to `limit`.
pub fn group(candidates: &[Candidate], per_doc: usize, limit: usize) -> Vec<Candidate> {
    let mut taken: HashMap<&str, usize> = HashMap::new();
    let mut out = Vec::with_capacity(limit);
    for c in candidates {
        let n = taken.entry(c.document_id.as_str()).or_default();
        if *n < per_doc {
            *n += 1;
            out.push(c.clone());
            if out.len() == limit {
                break;
            }
        }
    }
    out
}

/// Resolves a source filter: `type:name` exactly, a bare type (`git`), or a bare name (`docs`).
pub fn resolve_sources(wanted: &str, known: &[String]) -> Result<Vec<String>, KbError> {
    let matches: Vec<String> = known
        .iter()
        .filter(|k| {
            *k == wanted
                || k.split_once(':').is_some_and(|(ty, name)| !wanted.contains(':') && (ty == wanted || name == wanted))
        })
        .cloned()
        .collect();
    if matches.is_empty() {
        return Err(KbError::UnknownSource { given: wanted.to_string(), known: known.to_vec() });
    }
    Ok(matches)
}
