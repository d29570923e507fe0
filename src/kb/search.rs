//! Search over the store: mode handling, source filters, limits, and grouping by document.

use std::collections::HashMap;
use std::sync::Arc;

use super::query::fts_query_rooted;
use super::snippet::{snippet, Mark};
use super::store::{Candidate, SearchFilter, Store};
use super::{normalize_date, KbError};
use crate::config::Config;
use crate::embed::Embedder;
use crate::types::{
    HitExplain, HitExplainMatched, ListRank, SearchExplain, SearchHit, SearchMode, SearchRequest, SearchResponse,
};

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
    let query = fts_query_rooted(request.query.as_str(), &mut |prefix| store.prefix_root(prefix))?;
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
        return Err(match request.query.trim() {
            "" => KbError::EmptyQuery,
            text => KbError::NoWords(text.chars().take(80).collect()),
        });
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
            let (hits, list) = ranked(
                |window| {
                    let list = semantic_list(store, embedder.as_ref(), &vector, &filter, window, &mut notes)?;
                    let exhausted = list.len() < window;
                    Ok((list, exhausted))
                },
                limit,
                per_doc,
            )?;
            let ranks = list.iter().enumerate().map(|(i, c)| (c.chunk_id, Ranks::semantic(i, c.score))).collect();
            (hits, list.len(), ranks)
        }
        (Some(embedder), _) => {
            let vector = query_vector(embedder.as_ref(), request.query.as_str())?;
            // Fusion takes keyword search's own ranking: the chunks with every term first, then
            // those with some (or words they start). Chosen on the Debian quality set (nDCG@10
            // 0.9022 against 0.8912 for the any-term list), and on the held-out man pages it
            // keeps hybrid at or above keyword search, where the any-term list fell below it: a
            // chunk with every word stays ahead of a weak model's guesses.
            let (strict, wide) = match &query {
                Some(query) => (query.all.clone(), query.wide.clone()),
                None => {
                    notes
                        .push("the query has no word to match, so hybrid ranks by the semantic list alone".to_string());
                    (String::new(), None)
                }
            };
            fts = match &wide {
                Some(wide) => format!("{strict} | {wide}"),
                None => strict.clone(),
            };
            let (k, weight) = (retrieval.rrf_k as f64, hybrid_weight(retrieval, embedder.as_ref()));
            // Widened, like a single list, when grouping by document leaves the page short
            // (long documents fill a window of chunks) and a list has more to give.
            let mut window = FUSION_WINDOW.max(limit * per_doc);
            loop {
                let (keyword, full) = keyword_list(store, &strict, wide.as_deref(), &filter, window)?;
                let semantic = semantic_list(store, embedder.as_ref(), &vector, &filter, window, &mut notes)?;
                let (fused, ranks) = fuse(&keyword, &semantic, k, weight);
                let hits = group(&fused, per_doc, limit);
                let more = full || semantic.len() == window;
                if hits.len() == limit || !more || window == MAX_CANDIDATES {
                    break (hits, keyword.len() + semantic.len(), ranks);
                }
                window = (window * 4).min(MAX_CANDIDATES);
            }
        }
        (None, _) => {
            let query = query.as_ref().ok_or(KbError::EmptyQuery)?;
            let (mut hits, strict) = ranked(|window| one_list(store, &fts, &filter, window), limit, per_doc)?;
            let mut candidates = strict.len();
            let mut ranks: HashMap<i64, Ranks> = strict
                .iter()
                .enumerate()
                .map(|(i, c)| (c.chunk_id, Ranks { matched: Some(true), ..Ranks::keyword(i, c.score) }))
                .collect();
            // A whole question rarely has every word in one chunk: the page is filled with
            // chunks that have some of them, each ranked below every chunk that has them all.
            if let (true, Some(wide)) = (hits.len() < limit, &query.wide) {
                let (filled, list) = ranked(
                    |window| {
                        let (more, exhausted) = one_list(store, wide, &filter, window)?;
                        let mut list = strict.clone();
                        list.extend(more.into_iter().filter(|c| !ranks.contains_key(&c.chunk_id)));
                        Ok((list, exhausted))
                    },
                    limit,
                    per_doc,
                )?;
                let added = filled.len() - hits.len();
                if added > 0 {
                    notes.push(match strict.len() {
                        0 => "no chunk matched every term, so results match some of them (or words they start)"
                            .to_string(),
                        n => format!(
                            "only {n} chunk(s) matched every term; {added} more result(s) match some of them \
                             (or words they start), ranked below"
                        ),
                    });
                    fts = format!("{fts} | {wide}");
                }
                for (i, c) in list.iter().enumerate().skip(strict.len()) {
                    ranks.insert(c.chunk_id, Ranks { matched: Some(false), ..Ranks::keyword(i, c.score) });
                }
                candidates = list.len();
                hits = filled;
            }
            (hits, candidates, ranks)
        }
    };
    let marks = match &query {
        Some(query) => marks(store, &query.terms)?,
        None => Vec::new(),
    };
    let texts = store.chunk_texts(&hits.iter().map(|c| c.chunk_id).collect::<Vec<_>>())?;
    let results = hits
        .into_iter()
        .map(|c| SearchHit {
            snippet: texts.get(&c.chunk_id).map(|text| snippet(text, &marks)).unwrap_or_default(),
            location: location(&c),
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
    // Chunks still waiting for their vector (filled in the background) are missing from the
    // semantic list: said when asked, counted only then (a count is a scan).
    if request.explain && mode != SearchMode::Keyword {
        if let Some(embedder) = &embedder {
            let coverage = store.coverage()?;
            let missing = coverage.chunks - coverage.of(embedder.name(), embedder.dims());
            if missing > 0 {
                let ranked = if hybrid { "they rank by keyword only" } else { "semantic search does not find them" };
                notes.push(format!(
                    "{missing} of {} chunk(s) have no vector of {} yet (ctx serve fills them in the background, or run ctx embed): {ranked}",
                    coverage.chunks,
                    embedder.name()
                ));
            }
        }
    }
    let explain = request.explain.then(|| SearchExplain {
        requested_mode: requested,
        mode,
        fts_query: fts.clone(),
        candidates: candidates as u64,
        notes: notes.clone(),
        model: embedder.as_ref().map(|e| e.name().to_string()),
        rrf_k: hybrid.then_some(retrieval.rrf_k),
        hybrid_weight: hybrid.then(|| embedder.as_deref().map(|e| hybrid_weight(retrieval, e))).flatten(),
    });
    Ok(SearchResponse { results, mode, explain })
}

/// Hybrid's keyword side: the first `window` chunks with every term, then the first `window`
/// with some (or words they start) that are not among them, and whether either list had more.
pub fn keyword_list(
    store: &dyn Store,
    strict: &str,
    wide: Option<&str>,
    filter: &SearchFilter,
    window: usize,
) -> Result<(Vec<Candidate>, bool), KbError> {
    if strict.is_empty() {
        return Ok((Vec::new(), false));
    }
    let all = store.keyword_candidates(strict, filter, window)?;
    let Some(wide) = wide else {
        let full = all.len() == window;
        return Ok((all, full));
    };
    let more = store.keyword_candidates(wide, filter, window)?;
    let full = all.len() == window || more.len() == window;
    let seen: std::collections::HashSet<i64> = all.iter().map(|c| c.chunk_id).collect();
    let mut list = all;
    list.extend(more.into_iter().filter(|c| !seen.contains(&c.chunk_id)));
    Ok((list, full))
}

/// The semantic list's weight in hybrid fusion: `[retrieval] hybrid_weight`, or the model's own.
pub fn hybrid_weight(retrieval: &crate::types::RetrievalConfig, embedder: &dyn Embedder) -> f64 {
    retrieval.hybrid_weight.unwrap_or_else(|| embedder.hybrid_weight())
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
    /// Keyword search: whether the chunk has every term (`None` in the other modes).
    pub matched: Option<bool>,
}

impl Ranks {
    fn keyword(at: usize, score: f64) -> Ranks {
        Ranks { keyword: Some((at + 1, score)), ..Ranks::default() }
    }

    fn semantic(at: usize, score: f64) -> Ranks {
        Ranks { semantic: Some((at + 1, score)), ..Ranks::default() }
    }

    fn explain(&self) -> HitExplain {
        let rank = |r: Option<(usize, f64)>| r.map(|(rank, score)| ListRank { rank: rank as u64, score });
        let matched = self.matched.map(|all| match all {
            true => HitExplainMatched::AllTerms,
            false => HitExplainMatched::SomeTerms,
        });
        HitExplain { keyword: rank(self.keyword), semantic: rank(self.semantic), matched }
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

/// The top `limit` chunks of a ranked list (`list(window)` gives its first `window`, and whether
/// that is all of it), at most `per_doc` per document, and the list they were taken from.
fn ranked(
    mut list: impl FnMut(usize) -> Result<(Vec<Candidate>, bool), KbError>,
    limit: usize,
    per_doc: usize,
) -> Result<(Vec<Candidate>, Vec<Candidate>), KbError> {
    let mut window = (limit * per_doc.max(3)).clamp(30, MAX_CANDIDATES);
    loop {
        let (candidates, exhausted) = list(window)?;
        let hits = group(&candidates, per_doc, limit);
        if hits.len() == limit || exhausted || window == MAX_CANDIDATES {
            return Ok((hits, candidates));
        }
        window = (window * 4).min(MAX_CANDIDATES);
    }
}

/// The first `window` keyword candidates of one MATCH expression, and whether that is all.
fn one_list(
    store: &dyn Store,
    fts: &str,
    filter: &SearchFilter,
    window: usize,
) -> Result<(Vec<Candidate>, bool), KbError> {
    let list = store.keyword_candidates(fts, filter, window)?;
    let exhausted = list.len() < window;
    Ok((list, exhausted))
}

/// Where a hit is within its source: a file's path, else a script item's URL, else its id.
fn location(c: &Candidate) -> String {
    match (c.source.starts_with("script:"), &c.source_url) {
        (true, Some(url)) => url.clone(),
        _ => c.source_id.clone(),
    }
}

/// What snippets mark for the query's terms: each term as typed, and for a stemming index the
/// part a term shares with its stem, so "rollback" also marks "Rollbacks" and "deploy" marks
/// "deployed" (the index matched them by stem; the snippet approximates that by the shared start).
fn marks(store: &dyn Store, terms: &[(String, bool)]) -> Result<Vec<Mark>, KbError> {
    let mut marks = Vec::with_capacity(terms.len() * 2);
    for (term, prefix) in terms {
        if *prefix {
            marks.push(Mark::Prefix(term.clone()));
            continue;
        }
        marks.push(Mark::Word(term.clone()));
        let stem = store.stem(term)?;
        let shared: String = term.chars().zip(stem.chars()).take_while(|(a, b)| a == b).map(|(a, _)| a).collect();
        // Also when the stem is the word itself: "rollbacks" stems to "rollback".
        if shared.chars().count() >= 3 {
            marks.push(Mark::Stem(shared));
        }
    }
    Ok(marks)
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
