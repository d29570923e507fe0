//! `ctx sync`, `ctx search`, `ctx get`, `ctx sources [prune]`, `ctx stats`.

use std::io::IsTerminal;
use std::sync::Arc;

use anyhow::Context;

use super::{CliError, Globals};
use crate::kb::sync::{Progress, SyncOptions};
use crate::kb::{Kb, KbError};
use crate::types::{SearchMode, SearchRequest, SearchRequestQuery};

#[derive(Debug, clap::Args)]
pub struct SyncArgs {
    /// What to sync: all, a type (filesystem, git, script), or one source as type:name or its bare name.
    #[arg(default_value = "all")]
    pub target: String,
    /// Re-index every item, even unchanged ones.
    #[arg(long)]
    pub full: bool,
    /// Scan and report what would change; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Let a scan delete more than half of a source's documents. Refused by default: an API
    /// outage that answers with an empty list, or an unmounted folder, looks the same.
    #[arg(long)]
    pub allow_shrink: bool,
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
pub struct SourcesArgs {
    #[command(subcommand)]
    pub command: Option<SourcesCommand>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Subcommand)]
pub enum SourcesCommand {
    /// Delete the documents of sources that are no longer configured (after a section was
    /// renamed or removed), and what is remembered of their syncs.
    Prune(PruneArgs),
}

#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    /// Say what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON.
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
    let shared = crate::app::database::open(&config, crate::app::database::Role::Command)
        .map_err(|e| CliError::Failed(anyhow::anyhow!(e)))?;
    Kb::open_shared(Arc::new(config), shared).map_err(kb_error)
}

/// Input problems are usage errors (exit 2); the rest are runtime failures (exit 1).
fn kb_error(err: KbError) -> CliError {
    match err.is_callers_mistake() {
        true => CliError::Usage(err.to_string()),
        false => CliError::Failed(err.into()),
    }
}

pub fn sync(args: SyncArgs, globals: &Globals) -> Result<(), CliError> {
    let kb = open(globals)?;
    let options = SyncOptions { full: args.full, dry_run: args.dry_run, allow_shrink: args.allow_shrink };
    let tty = std::io::stderr().is_terminal() && !args.json && !globals.quiet;
    let mut bar: Option<indicatif::ProgressBar> = None;
    // `-v` lists every skipped entry after its source's line; without it they are only counted.
    let mut skips: Vec<(String, String, String)> = Vec::new();
    let list_skips = globals.verbose > 0;
    let mut progress = |event: Progress<'_>| match event {
        Progress::Start { source, estimate } if tty => bar = Some(progress_bar(source, estimate)),
        Progress::Item { seen, .. } => {
            if let Some(bar) = &bar {
                // More items than the source held before: the estimate grows with them.
                if bar.length().is_some_and(|len| seen as u64 > len) {
                    bar.set_length(seen as u64);
                }
                bar.set_position(seen as u64);
            }
        }
        Progress::Skipped { source, source_id, reason } if list_skips => {
            skips.push((source.to_string(), source_id.to_string(), reason.to_string()));
        }
        // Cleared, not finished: the summary lines below say what the bar said.
        Progress::Done { .. } => {
            if let Some(bar) = bar.take() {
                bar.finish_and_clear();
            }
        }
        _ => {}
    };
    let summaries = crate::kb::sync::sync_target(&kb, &args.target, options, &mut progress);
    if let Some(bar) = bar.take() {
        bar.finish_and_clear();
    }
    let summaries = summaries.map_err(kb_error)?;
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
            if !globals.quiet && !s.skipped_by_reason.is_empty() {
                let hint = if list_skips { "" } else { " (-v lists them)" };
                println!("  skipped {}{hint}", skip_counts(&s.skipped_by_reason));
            }
        }
        for (_, id, reason) in skips.iter().filter(|(source, ..)| *source == s.source) {
            eprintln!("skipped {id} ({}): {reason}", s.source);
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
    let background = kb.embeds_in_background();
    if !args.dry_run && background {
        // The vectors come later, from `ctx serve` or `ctx embed`: say how many wait.
        if let Ok(Some(embedder)) = kb.embedder() {
            let (missing, _) = crate::kb::embedding::pending(kb.store(), embedder.as_ref()).map_err(kb_error)?;
            if missing > 0 && !args.json && !globals.quiet {
                println!(
                    "{missing} chunk(s) wait for vectors of {} (embedded in the background): ctx serve fills them, or run ctx embed",
                    embedder.name()
                );
            }
        }
    } else if !args.dry_run && summaries.iter().any(|s| s.embed_error.is_none()) {
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

/// A progress line for one source: done/total when the source held documents before (a re-sync
/// sees about as many), else a count; a whole-number rate and the elapsed time. No colours: the
/// templates use no styles.
fn progress_bar(source: &str, estimate: Option<usize>) -> indicatif::ProgressBar {
    use indicatif::{ProgressBar, ProgressState, ProgressStyle};
    let (bar, template) = match estimate {
        Some(total) => {
            (ProgressBar::new(total as u64), "{prefix}: [{bar:24}] {human_pos}/{human_len} items, {rate}, {elapsed}")
        }
        None => (ProgressBar::new_spinner(), "{spinner} {prefix}: {human_pos} items, {rate}, {elapsed}"),
    };
    let style = ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
        .with_key("rate", |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let rate = state.per_sec();
            let rate = if rate.is_finite() { rate.round() as u64 } else { 0 };
            let _ = write!(w, "{}/s", indicatif::HumanCount(rate));
        })
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(source.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

/// `1204` as `1,204`.
fn count(n: i64) -> indicatif::HumanCount {
    indicatif::HumanCount(n.max(0) as u64)
}

/// `1,912 binary files, 3 over max_file_bytes`: one count per skip reason.
fn skip_counts(by_reason: &std::collections::BTreeMap<String, usize>) -> String {
    let plural = |n: usize, one: &str, many: &str| {
        format!("{} {}", indicatif::HumanCount(n as u64), if n == 1 { one } else { many })
    };
    by_reason
        .iter()
        .map(|(kind, &n)| match kind.as_str() {
            "binary" => plural(n, "binary file", "binary files"),
            "too_large" => plural(n, "over max_file_bytes", "over max_file_bytes"),
            "unreadable" => plural(n, "unreadable entry", "unreadable entries"),
            "invalid" => plural(n, "invalid item", "invalid items"),
            "duplicate" => plural(n, "duplicate id", "duplicate ids"),
            other => plural(n, other, other),
        })
        .collect::<Vec<_>>()
        .join(", ")
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

pub fn sources(args: SourcesArgs, globals: &Globals) -> Result<(), CliError> {
    if let Some(SourcesCommand::Prune(prune_args)) = args.command {
        return prune(prune_args, globals);
    }
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

/// What `ctx sources prune --json` prints.
#[derive(serde::Serialize)]
struct PruneReport {
    dry_run: bool,
    /// The sources that were (or, in a dry run, would be) deleted, with what they held.
    sources: Vec<crate::kb::prune::Unconfigured>,
}

/// `ctx sources prune`: says what it will delete, then deletes it one source at a time (each in
/// one transaction: a prune killed half-way leaves every source whole or gone).
fn prune(args: PruneArgs, globals: &Globals) -> Result<(), CliError> {
    let kb = open(globals)?;
    let plan = crate::kb::prune::unconfigured(&kb).map_err(kb_error)?;
    if !args.json {
        if plan.is_empty() {
            println!("nothing to prune: every source in the database is configured");
            return Ok(());
        }
        let verb = if args.dry_run { "would delete" } else { "deleting" };
        println!("{verb} {} source(s) that are no longer configured:", plan.len());
        for source in &plan {
            println!("  {}: {} document(s), {} chunk(s)", source.source, count(source.documents), count(source.chunks));
        }
    }
    if !args.dry_run {
        for source in &plan {
            let removed = crate::kb::prune::remove(&kb, &source.source)
                .map_err(|e| CliError::Failed(anyhow::anyhow!("deleting {} failed: {e}", source.source)))?;
            if !args.json && !globals.quiet {
                let (documents, chunks) = (count(removed.documents), count(removed.chunks));
                println!("deleted {}: {documents} document(s), {chunks} chunk(s)", source.source);
            }
        }
    }
    if args.json {
        let report = PruneReport { dry_run: args.dry_run, sources: plan };
        println!("{}", serde_json::to_string_pretty(&report).context("serialise prune report")?);
    } else if args.dry_run {
        println!("dry run: nothing was deleted; run `ctx sources prune` to delete them");
    }
    Ok(())
}

pub fn stats(args: JsonFlag, globals: &Globals) -> Result<(), CliError> {
    let kb = open(globals)?;
    let stats = kb.stats().map_err(kb_error)?;
    // Chunks without a vector of the configured model: the background filler's work left.
    let pending = match kb.embedder() {
        Ok(Some(embedder)) => Some((
            crate::kb::embedding::pending(kb.store(), embedder.as_ref()).map_err(kb_error)?.0,
            embedder.name().to_string(),
        )),
        _ => None,
    };
    if args.json {
        let mut json = serde_json::to_value(&stats).context("serialise stats")?;
        if let (Some((missing, _)), Some(map)) = (&pending, json.as_object_mut()) {
            map.insert("pending_vectors".to_string(), serde_json::json!(missing));
        }
        println!("{}", serde_json::to_string_pretty(&json).context("serialise stats")?);
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
    if let Some((missing, model)) = pending.filter(|(missing, _)| *missing > 0) {
        println!(
            "pending:   {missing} chunk(s) without a vector of {model} (ctx serve fills them in the background; ctx embed does it now)"
        );
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
