//! `ctx sync`, `ctx search`, `ctx get`, `ctx sources`, `ctx stats`.

use std::io::IsTerminal;
use std::sync::Arc;

use anyhow::Context;

use super::{CliError, Globals};
use crate::kb::sync::{Progress, SyncOptions};
use crate::kb::{Kb, KbError};
use crate::types::{SearchMode, SearchRequest, SearchRequestQuery};

#[derive(Debug, clap::Args)]
pub struct SyncArgs {
    /// What to sync: all, a type (filesystem, git, script) or one source as type:name.
    #[arg(default_value = "all")]
    pub target: String,
    /// Re-index every item, even unchanged ones.
    #[arg(long)]
    pub full: bool,
    /// Scan and report what would change; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// One JSON summary line per source instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct SearchArgs {
    /// What to look for. Any text works; a trailing * makes a word a prefix.
    pub query: String,
    /// Ranking mode.
    #[arg(long, value_enum, default_value = "keyword")]
    pub mode: ModeArg,
    /// Only this source: type:name, a type (git) or a name (docs).
    #[arg(long)]
    pub source: Option<String>,
    /// Only documents updated on or after this date (YYYY-MM-DD or RFC 3339).
    #[arg(long)]
    pub since: Option<String>,
    /// Number of results. Default: retrieval.default_limit.
    #[arg(long)]
    pub limit: Option<u64>,
    /// Print the response as JSON.
    #[arg(long)]
    pub json: bool,
    /// Show how the results were ranked.
    #[arg(long)]
    pub explain: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ModeArg {
    Keyword,
    Semantic,
    Hybrid,
}

#[derive(Debug, clap::Args)]
pub struct GetArgs {
    /// Document id, as printed by search.
    pub id: String,
    /// Print the document as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct JsonFlag {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub(super) fn open(globals: &Globals) -> Result<Kb, CliError> {
    let config = globals.load_config()?;
    Kb::open(Arc::new(config)).map_err(kb_error)
}

/// Input problems are usage errors (exit 2); the rest are runtime failures (exit 1).
fn kb_error(err: KbError) -> CliError {
    match err {
        KbError::EmptyQuery
        | KbError::NoWords(_)
        | KbError::SemanticUnavailable
        | KbError::UnknownSource { .. }
        | KbError::UnknownTarget { .. }
        | KbError::BadDate(_)
        | KbError::BadLimit { .. } => CliError::Usage(err.to_string()),
        other => CliError::Failed(other.into()),
    }
}

pub fn sync(args: SyncArgs, globals: &Globals) -> Result<(), CliError> {
    let kb = open(globals)?;
    let options = SyncOptions { full: args.full, dry_run: args.dry_run };
    let tty = std::io::stderr().is_terminal() && !args.json && !globals.quiet;
    let bar = tty.then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {prefix}: {pos} items ({per_sec}) {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    });
    let mut current = String::new();
    let mut progress = |event: Progress<'_>| {
        let Some(bar) = &bar else { return };
        match event {
            Progress::Item { source, seen } => {
                if current != source {
                    current = source.to_string();
                    bar.reset();
                    bar.set_prefix(current.clone());
                }
                bar.set_position(seen as u64);
            }
            Progress::Skipped { source_id, reason, .. } => bar.set_message(format!("skipped {source_id}: {reason}")),
        }
    };
    let summaries = crate::kb::sync::sync_target(&kb, &args.target, options, &mut progress).map_err(kb_error)?;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let mut failed = 0;
    for s in &summaries {
        if args.json {
            println!("{}", serde_json::to_string(s).context("serialise summary")?);
        } else if !globals.quiet || s.error.is_some() {
            let verb = if s.dry_run { "would sync" } else { "synced" };
            let embedded = if s.embedded > 0 { format!(", {} chunk(s) embedded", s.embedded) } else { String::new() };
            println!(
                "{verb} {}: {} added, {} updated, {} deleted, {} unchanged, {} skipped, {} error(s){embedded} in {:.2}s",
                s.source, s.added, s.updated, s.deleted, s.unchanged, s.skipped, s.errors, s.seconds
            );
        }
        if let Some(e) = &s.error {
            failed += 1;
            eprintln!("error: {}: {e}", s.source);
        }
        if let Some(e) = &s.embed_error {
            eprintln!("warning: {}: written without vectors: {e}", s.source);
        }
    }
    // Vectors for what has none yet: chunks synced before, or with another model.
    let mut embed_failed = None;
    if !args.dry_run && summaries.iter().any(|s| s.embed_error.is_none()) {
        if let Err(e) = super::embed_cmd::backfill(&kb, !args.json && !globals.quiet) {
            embed_failed = Some(e);
        }
    }
    if summaries.is_empty() && !args.json {
        println!("nothing to sync: no connectors configured; add a [connectors.filesystem.<name>] section to ctx.toml");
    }
    if failed > 0 {
        return Err(CliError::Failed(anyhow::anyhow!("{failed} of {} source(s) failed to sync", summaries.len())));
    }
    if let Some(e) = embed_failed {
        return Err(e);
    }
    if let Some(s) = summaries.iter().find(|s| s.embed_error.is_some()) {
        return Err(CliError::Failed(anyhow::anyhow!(
            "documents were indexed for keyword search, but not embedded: {}",
            s.embed_error.as_deref().unwrap_or_default()
        )));
    }
    Ok(())
}

pub fn search(args: SearchArgs, globals: &Globals) -> Result<(), CliError> {
    let kb = open(globals)?;
    if args.query.trim().is_empty() {
        return Err(kb_error(KbError::EmptyQuery));
    }
    let query = SearchRequestQuery::try_from(args.query.as_str())
        .map_err(|e| CliError::Usage(format!("invalid query: {e}")))?;
    let request = SearchRequest {
        query,
        mode: Some(match args.mode {
            ModeArg::Keyword => SearchMode::Keyword,
            ModeArg::Semantic => SearchMode::Semantic,
            ModeArg::Hybrid => SearchMode::Hybrid,
        }),
        limit: args.limit,
        source: args
            .source
            .as_deref()
            .map(|s| s.try_into().map_err(|e| CliError::Usage(format!("invalid --source: {e}"))))
            .transpose()?,
        since: args.since,
        // Always asked for: its notes (a fallback, vectors missing) reach stderr without --explain.
        explain: true,
    };
    let mut response = kb.search(&request).map_err(kb_error)?;
    if !args.explain {
        if let Some(explain) = response.explain.take() {
            for note in &explain.notes {
                eprintln!("note: {note}");
            }
        }
        // The ranks were asked for only to get the notes: the output is as without --explain.
        response.results.iter_mut().for_each(|hit| hit.explain = None);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&response).context("serialise results")?);
        return Ok(());
    }
    if response.results.is_empty() {
        println!("no results");
    }
    for (i, hit) in response.results.iter().enumerate() {
        println!("{}. {}  [{}]  score {}", i + 1, hit.title, hit.source, score(hit.score));
        println!("   {}  (chunk {}, updated {})", hit.location, hit.chunk_index, hit.updated_at);
        println!("   id {}", hit.id);
        if let Some(url) = &hit.source_url {
            println!("   {url}");
        }
        println!("   {}", hit.snippet.replace('\n', " "));
        if let Some(ranks) = &hit.explain {
            let show = |r: &Option<crate::types::ListRank>| match r {
                Some(r) => format!("#{} ({:.3})", r.rank, r.score),
                None => "-".to_string(),
            };
            println!("   keyword {}  semantic {}", show(&ranks.keyword), show(&ranks.semantic));
        }
    }
    if let Some(explain) = &response.explain {
        println!();
        let name = |m: SearchMode| {
            serde_json::to_value(m).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
        };
        println!("mode: {} (requested {})", name(explain.mode), name(explain.requested_mode));
        if !explain.fts_query.is_empty() {
            println!("fts query: {}", explain.fts_query);
        }
        println!("candidates ranked: {}", explain.candidates);
        if let Some(model) = &explain.model {
            println!("embedding model: {model}");
        }
        if let (Some(k), Some(w)) = (explain.rrf_k, explain.hybrid_weight) {
            println!("fusion: reciprocal rank, k = {k}, semantic weight {w}, keyword weight {:.2}", 1.0 - w);
        }
        for note in &explain.notes {
            println!("note: {note}");
        }
    }
    Ok(())
}

/// A score with three significant digits: BM25 gives a word that most chunks of a small
/// collection hold a near-zero weight, and a fixed `{:.3}` printed 0.000 for every hit.
fn score(value: f64) -> String {
    let v = value.abs();
    if v == 0.0 {
        "0".to_string()
    } else if v >= 100.0 {
        format!("{value:.0}")
    } else if v >= 0.01 {
        let decimals = 2 - v.log10().floor() as i32;
        format!("{value:.*}", decimals.max(0) as usize)
    } else {
        format!("{value:.2e}")
    }
}

pub fn get(args: GetArgs, globals: &Globals) -> Result<(), CliError> {
    let kb = open(globals)?;
    let doc = kb.get(&args.id).map_err(kb_error)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&doc).context("serialise document")?);
        return Ok(());
    }
    println!("{}\n", doc.title);
    println!("id:       {}", doc.id);
    println!("source:   {} ({})", doc.source, doc.source_id);
    println!("type:     {}", doc.content_type);
    println!("updated:  {}", doc.updated_at);
    if let Some(url) = &doc.source_url {
        println!("url:      {url}");
    }
    if let Some(author) = &doc.author {
        println!("author:   {author}");
    }
    println!("chunks:   {}\n", doc.chunks.len());
    println!("{}", doc.body);
    Ok(())
}

pub fn sources(args: JsonFlag, globals: &Globals) -> Result<(), CliError> {
    let kb = open(globals)?;
    let response = kb.sources().map_err(kb_error)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&response).context("serialise sources")?);
        return Ok(());
    }
    if response.sources.is_empty() {
        println!("no sources configured");
    }
    for s in &response.sources {
        let health = if s.healthy { "ok" } else { "FAILING" };
        println!(
            "{:<32} {:<7} {:>7} docs {:>8} chunks  last sync {}",
            s.name,
            health,
            s.documents,
            s.chunks,
            s.last_sync.as_deref().unwrap_or("never")
        );
        if let Some(notes) = &s.notes {
            println!("    {notes}");
        }
    }
    Ok(())
}

pub fn stats(args: JsonFlag, globals: &Globals) -> Result<(), CliError> {
    let kb = open(globals)?;
    let stats = kb.stats().map_err(kb_error)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&stats).context("serialise stats")?);
        return Ok(());
    }
    println!("database:  {}", kb.config().db_path().display());
    println!("documents: {}", stats.documents);
    println!("chunks:    {}", stats.chunks);
    println!("sources:   {}", stats.sources);
    println!("size:      {:.1} MiB", stats.database_bytes as f64 / (1024.0 * 1024.0));
    println!("schema:    v{}", stats.schema_version);
    for v in &stats.vectors {
        println!("vectors:   {} of {} chunks, {} ({} dims)", v.chunks, stats.chunks, v.model, v.dims);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn scores_keep_three_significant_digits() {
        assert_eq!(super::score(2.1726), "2.17");
        assert_eq!(super::score(0.04567), "0.0457");
        assert_eq!(super::score(0.0000015472), "1.55e-6");
        assert_eq!(super::score(0.0000010586), "1.06e-6");
        assert_eq!(super::score(123.4), "123");
        assert_eq!(super::score(0.0), "0");
    }
}
