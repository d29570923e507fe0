//! Search over the store: mode handling, source filters, limits, and grouping by document.

use std::collections::HashMap;

use super::query::fts_query;
use super::snippet::snippet;
use super::store::{Candidate, SearchFilter, Store};
use super::{normalize_date, KbError};
use crate::config::Config;
use crate::types::{SearchExplain, SearchHit, SearchMode, SearchRequest, SearchResponse};

/// The most candidates one search ranks before grouping.
const MAX_CANDIDATES: usize = 5000;

/// Runs `request` against `store`. `known_sources` resolves the `source` filter.
pub fn search(
    store: &dyn Store,
    config: &Config,
    known_sources: &[String],
    request: &SearchRequest,
) -> Result<SearchResponse, KbError> {
    let retrieval = &config.spec.retrieval;
    let requested = request.mode.unwrap_or(SearchMode::Keyword);
    let mut notes = Vec::new();
    let mode = match requested {
        SearchMode::Keyword => SearchMode::Keyword,
        SearchMode::Semantic => return Err(KbError::SemanticUnavailable),
        SearchMode::Hybrid => {
            notes.push("hybrid search fell back to keyword: no embedding provider is configured ([embedding] provider = \"disabled\")".to_string());
            SearchMode::Keyword
        }
    };
    let limit = match request.limit {
        None => retrieval.default_limit as usize,
        Some(n) if n >= 1 && n <= retrieval.max_limit => n as usize,
        Some(n) => return Err(KbError::BadLimit { given: n as i64, max: retrieval.max_limit as i64 }),
    };
    let query = fts_query(request.query.as_str()).ok_or(KbError::EmptyQuery)?;
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

    // Rank a few times more chunks than asked, then keep at most per_doc per document. Widen
    // the candidate window only when grouping left the page short and more matches exist.
    let mut fts = query.all.clone();
    let (mut hits, mut candidates) = ranked(store, &fts, &filter, limit, per_doc)?;
    if hits.is_empty() {
        if let Some(any) = &query.any {
            notes.push("no chunk matched every term, so results match any of them".to_string());
            fts = any.clone();
            (hits, candidates) = ranked(store, &fts, &filter, limit, per_doc)?;
        }
    }
    let texts = store.chunk_texts(&hits.iter().map(|c| c.chunk_id).collect::<Vec<_>>())?;
    let results = hits
        .into_iter()
        .map(|c| SearchHit {
            snippet: texts.get(&c.chunk_id).map(|text| snippet(text, &query.terms)).unwrap_or_default(),
            id: c.document_id,
            chunk_index: c.chunk_index as u64,
            score: c.score.max(0.0),
            title: c.title,
            source: c.source,
            source_url: c.source_url,
            updated_at: c.updated_at,
        })
        .collect();
    let explain = request.explain.then(|| SearchExplain {
        requested_mode: requested,
        mode,
        fts_query: fts.clone(),
        candidates: candidates as u64,
        notes: notes.clone(),
    });
    Ok(SearchResponse { results, mode, explain })
}

/// The top `limit` chunks for one MATCH expression, at most `per_doc` per document, and how many
/// candidates were ranked.
fn ranked(
    store: &dyn Store,
    fts: &str,
    filter: &SearchFilter,
    limit: usize,
    per_doc: usize,
) -> Result<(Vec<Candidate>, usize), KbError> {
    let mut window = (limit * per_doc.max(3)).clamp(30, MAX_CANDIDATES);
    loop {
        let candidates = store.keyword_candidates(fts, filter, window)?;
        let exhausted = candidates.len() < window || window == MAX_CANDIDATES;
        let hits = group(&candidates, per_doc, limit);
        if hits.len() == limit || exhausted {
            return Ok((hits, candidates.len()));
        }
        window = (window * 4).min(MAX_CANDIDATES);
    }
}

/// Keeps candidates in rank order, at most `per_doc` per document, up to `limit`.
fn group(candidates: &[Candidate], per_doc: usize, limit: usize) -> Vec<Candidate> {
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
