//! Sync: stream a connector's items into the store, incrementally, deleting what disappeared.
//!
//! Unchanged items (same content hash) are skipped; changed ones are re-chunked. Folders and git
//! repositories write in batches, each its own transaction, so a killed sync leaves a consistent
//! database and the next run picks up where it stopped. A script source writes in one
//! transaction ([`Commit::Whole`]): its items all come from one `scan()` return, bounded by its
//! `max_bytes`, and a script stopped half-way (its deadline, its budget) leaves the source as it
//! was. Deletions happen only after a scan completed: a source that fails half-way never loses
//! documents it did not get to see. A script source's `context` for its next sync (when this one
//! started, and its `context.state`) is written by the same transaction, and an incremental
//! scan (`{items, deleted}`) deletes only what it names.
//!
//! A full scan that would leave less than half of a source (nothing at all, say) deletes
//! nothing unless allowed ([`SyncOptions::allow_shrink`], `allow_shrink` in the source's
//! section): an API that answers `[]` during an outage, or an unmounted folder, looks exactly
//! like that, and would otherwise empty the index.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::chunk::{chunk, ChunkSpec};
use super::store::{Change, NewDocument, Store, Writes};
use super::{document_id, normalize_date};
use crate::connectors::{ConnectorError, Event, Item, Sink, SkipReason};
use crate::embed::Embedder;

/// Writes per transaction.
const BATCH: usize = 512;

/// Bytes of document bodies a batch holds at most before it is written: large documents are
/// written as the scan goes, so memory stays bounded and a script source's deadline, checked
/// between items, covers writing them too (not only the last small batch after the scan). A
/// script source writes in one transaction, so from its first batch on it holds the write lock
/// while it converts (and embeds) the rest, within its deadline.
const BATCH_BYTES: usize = 8 * 1024 * 1024;

#[derive(Clone, Copy, Debug, Default)]
pub struct SyncOptions {
    /// Re-index every item even if unchanged.
    pub full: bool,
    /// Scan and count, write nothing.
    pub dry_run: bool,
    /// Let a full scan delete more than half of a source's documents (see [`shrink_refusal`]).
    pub allow_shrink: bool,
}

/// When a source's writes become visible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Commit {
    /// Batch by batch: a sync killed half-way keeps what it wrote, and the next one resumes.
    Batches,
    /// All at the end of a successful sync, or nothing.
    Whole,
}

/// Where a sync's batches go, per [`Commit`].
struct Writer<'s> {
    store: &'s dyn Store,
    commit: Commit,
    /// The open transaction of a [`Commit::Whole`] sync, begun at its first write so that the
    /// write lock is not held while the connector scans.
    session: Option<Box<dyn Writes + 's>>,
}

impl Writer<'_> {
    fn apply(&mut self, changes: &[Change]) -> Result<(), super::KbError> {
        match self.commit {
            Commit::Batches => self.store.apply(changes),
            Commit::Whole => {
                if self.session.is_none() {
                    self.session = Some(self.store.begin()?);
                }
                self.session.as_mut().map_or(Ok(()), |session| session.apply(changes))
            }
        }
    }

    /// Makes a [`Commit::Whole`] sync's writes visible (a no-op for batches). A writer dropped
    /// without it rolls them back.
    fn finish(&mut self) -> Result<(), super::KbError> {
        self.session.take().map_or(Ok(()), |session| session.commit())
    }
}

/// What one source's sync did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SourceSummary {
    pub source: String,
    pub added: usize,
    pub updated: usize,
    pub deleted: usize,
    pub unchanged: usize,
    pub skipped: usize,
    /// `skipped` by reason: `binary`, `too_large`, `unreadable`, `invalid` (an item a script
    /// returned that is not one), `duplicate` (a source id returned twice). A sync of a
    /// documentation tree skips the same thousands of images every time: counts, not a line each.
    pub skipped_by_reason: BTreeMap<String, usize>,
    pub errors: usize,
    /// Why the source failed, if it did.
    pub error: Option<String>,
    /// Chunk texts embedded for semantic search.
    pub embedded: usize,
    /// Why embedding stopped, if it did: the documents were written without vectors, and the
    /// next sync (or `ctx embed`) adds them.
    pub embed_error: Option<String>,
    pub seconds: f64,
    pub dry_run: bool,
}

/// Progress events for a UI.
pub enum Progress<'a> {
    /// A source's scan starts. `estimate` is how many documents it held before, a fair guess
    /// of how many items a re-sync sees; `None` on a first sync.
    Start {
        source: &'a str,
        estimate: Option<usize>,
    },
    /// One more item (not counting skipped entries, so that `seen` meets `estimate`).
    Item {
        source: &'a str,
        seen: usize,
    },
    Skipped {
        source: &'a str,
        source_id: &'a str,
        reason: &'a SkipReason,
    },
    /// The source's sync ended, written or failed.
    Done {
        source: &'a str,
    },
}

/// Where a sync writes: the store, and the embedder that gives new chunks their vectors.
#[derive(Clone, Copy)]
pub struct Index<'a> {
    pub store: &'a dyn Store,
    pub embedder: Option<&'a dyn Embedder>,
}

/// How long a sync waits for another process's sync of the same source to end.
const CLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Syncs one source. `scan` runs the connector, feeding the sink it is given.
pub fn sync_source(
    index: Index<'_>,
    source: &str,
    spec: ChunkSpec,
    options: SyncOptions,
    commit: Commit,
    scan: &mut dyn FnMut(&mut Sink<'_>) -> Result<(), ConnectorError>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> SourceSummary {
    let Index { store, embedder } = index;
    let started = Instant::now();
    // A script's cursor "since the last sync" must not miss what changed while this one ran.
    let started_at = super::now_rfc3339();
    let mut end = crate::connectors::ScanEnd::default();
    let mut summary = SourceSummary { source: source.to_string(), dry_run: options.dry_run, ..Default::default() };
    // On a shared database another replica may be syncing this source: one at a time.
    let _claim = match store.claim_source(source, CLAIM_WAIT) {
        Ok(claim) => claim,
        Err(e) => {
            summary.errors += 1;
            summary.error = Some(e.to_string());
            return summary;
        }
    };
    let known = match store.known_hashes(source) {
        Ok(known) => known,
        Err(e) => {
            summary.errors += 1;
            summary.error = Some(e.to_string());
            return summary;
        }
    };
    progress(Progress::Start { source, estimate: (!known.is_empty()).then_some(known.len()) });
    let mut seen: HashSet<String> = HashSet::with_capacity(known.len());
    let mut batch: Vec<Change> = Vec::with_capacity(BATCH);
    let mut batch_bytes = 0usize;
    let mut write_error: Option<String> = None;
    let mut writer = Writer { store, commit, session: None };
    let mut items = 0;

    let scanned = {
        let mut sink = |event: Event| -> Result<(), String> {
            match event {
                Event::Item(item) => {
                    if !seen.insert(item.source_id.clone()) {
                        summary.skipped += 1;
                        *summary.skipped_by_reason.entry("duplicate".to_string()).or_default() += 1;
                        tracing::debug!(source, source_id = %item.source_id, "duplicate source_id in one scan; keeping the first");
                        return Ok(());
                    }
                    items += 1;
                    progress(Progress::Item { source, seen: items });
                    let hash = content_hash(&item);
                    let previous = known.get(&item.source_id);
                    if previous == Some(&hash) && !options.full {
                        summary.unchanged += 1;
                        return Ok(());
                    }
                    if previous.is_some() {
                        summary.updated += 1;
                    } else {
                        summary.added += 1;
                    }
                    if !options.dry_run {
                        batch_bytes += item.body.len();
                        batch.push(Change::Upsert(Box::new(to_document(source, item, hash, spec))));
                        if batch.len() >= BATCH || batch_bytes >= BATCH_BYTES {
                            embed_batch(store, embedder, &mut batch, &mut summary);
                            writer.apply(&batch).map_err(|e| e.to_string())?;
                            batch.clear();
                            batch_bytes = 0;
                        }
                    }
                }
                Event::Skipped { source_id, reason } => {
                    summary.skipped += 1;
                    *summary.skipped_by_reason.entry(reason.kind().to_string()).or_default() += 1;
                    // Counted for the summary line; the same files are skipped on every sync.
                    tracing::debug!(source, source_id = %source_id, "skipped: {reason}");
                    progress(Progress::Skipped { source, source_id: &source_id, reason: &reason });
                    // A skipped item still exists at its source: don't delete its old version.
                    seen.insert(source_id);
                }
                Event::End(said) => end = said,
            }
            Ok(())
        };
        scan(&mut sink)
    };
    // A failed batched sync keeps what it saw; a failed whole one keeps nothing.
    if !options.dry_run && !batch.is_empty() && (scanned.is_ok() || commit == Commit::Batches) {
        embed_batch(store, embedder, &mut batch, &mut summary);
        if let Err(e) = writer.apply(&batch) {
            write_error = Some(e.to_string());
        }
    }
    match scanned {
        Ok(()) if write_error.is_none() => {
            // An incremental scan names what it deleted; a full one deletes what it did not see.
            let gone: Vec<Change> = match &end.deleted {
                Some(deleted) => deleted
                    .iter()
                    .filter(|id| known.contains_key(*id) && !seen.contains(*id))
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .map(|id| Change::Delete { source: source.to_string(), source_id: id.clone() })
                    .collect(),
                None => known
                    .keys()
                    .filter(|id| !seen.contains(*id))
                    .map(|id| Change::Delete { source: source.to_string(), source_id: id.clone() })
                    .collect(),
            };
            // An incremental scan names each deletion: an outage that answers with nothing
            // names nothing and deletes nothing, so only full scans are guarded.
            let refused = match end.deleted {
                None if !options.allow_shrink => shrink_refusal(source, known.len(), gone.len()),
                _ => None,
            };
            if let Some(why) = refused {
                // The source fails and keeps every document. A batched source keeps the new and
                // changed items it already wrote: they are real whatever the listing missed. A
                // script source's writes are one transaction with its saved state, and this
                // return is treated like a failed one: nothing is committed (the writer rolls
                // back when dropped), so its cursor does not move past items it may have failed
                // to return, and the next sync asks again from the last good one.
                summary.error = Some(why);
            } else {
                summary.deleted = gone.len();
                if !options.dry_run {
                    for part in gone.chunks(BATCH * 4) {
                        if let Err(e) = writer.apply(part) {
                            write_error = Some(e.to_string());
                            break;
                        }
                    }
                    // A script source's last success and state land in the same transaction as
                    // its documents: both, or neither.
                    if commit == Commit::Whole && write_error.is_none() {
                        let synced = Change::SourceSynced { source: source.to_string(), started_at, state: end.state };
                        if let Err(e) = writer.apply(&[synced]) {
                            write_error = Some(e.to_string());
                        }
                    }
                }
                if write_error.is_none() {
                    if let Err(e) = writer.finish() {
                        write_error = Some(e.to_string());
                    }
                }
            }
        }
        Ok(()) => {}
        Err(e) => summary.error = Some(e.to_string()),
    }
    if let Some(e) = write_error {
        summary.error = Some(format!("writing to the database failed: {e}"));
    }
    // Ends an uncommitted transaction before anything else writes.
    drop(writer);
    if summary.error.is_some() {
        summary.errors += 1;
        if commit == Commit::Whole {
            // The writer was dropped uncommitted: nothing of this sync was kept.
            summary.added = 0;
            summary.updated = 0;
            summary.deleted = 0;
        }
    }
    if !options.dry_run {
        if let Err(e) = store.record_sync(source, summary.error.as_deref(), started.elapsed()) {
            tracing::warn!(source, "could not record sync state: {e}");
        }
    }
    summary.seconds = started.elapsed().as_secs_f64();
    progress(Progress::Done { source });
    summary
}

/// Why a full scan of `source` may not delete `gone` of the `held` documents it holds: it would
/// leave fewer than half of them (none, when the scan returned nothing). `None` when it may.
fn shrink_refusal(source: &str, held: usize, gone: usize) -> Option<String> {
    let kept = held.saturating_sub(gone);
    if gone == 0 || kept * 2 >= held {
        return None;
    }
    let what = if kept == 0 {
        format!(
            "the scan returned none of the {} document(s) this source holds; not deleting them (an API \
             outage, or an empty or unmounted folder, can look like this)",
            grouped(held)
        )
    } else {
        format!(
            "the scan found only {} of the {} documents this source holds; not deleting the other {} (a \
             partial listing can look like this)",
            grouped(kept),
            grouped(held),
            grouped(gone)
        )
    };
    let section = source.split_once(':').map_or_else(|| source.to_string(), |(kind, name)| format!("{kind}.{name}"));
    Some(format!(
        "{what}. If the source really shrank, run `ctx sync {source} --allow-shrink`, or set `allow_shrink = true` in \
         [connectors.{section}]"
    ))
}

/// `1204` as `1,204`.
fn grouped(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Adds vectors to a batch before it is written. A provider that fails stops embedding for the
/// rest of this sync (the batch is written without vectors; a backfill adds them later), so a
/// service that is down costs one timeout, not one per batch.
fn embed_batch(store: &dyn Store, embedder: Option<&dyn Embedder>, batch: &mut [Change], summary: &mut SourceSummary) {
    let Some(embedder) = embedder else { return };
    if summary.embed_error.is_some() {
        return;
    }
    match super::embedding::attach(store, embedder, batch) {
        Ok(n) => summary.embedded += n,
        Err(e) => {
            tracing::warn!(source = %summary.source, "embedding failed, writing without vectors: {e}");
            summary.embed_error = Some(e.to_string());
        }
    }
}

/// SHA-256 over every indexed field except the dates, so touching a file changes nothing.
pub fn content_hash(item: &Item) -> String {
    let mut hasher = Sha256::new();
    for part in [
        item.title.as_str(),
        item.body.as_str(),
        item.content_type.as_str(),
        item.source_url.as_deref().unwrap_or(""),
        item.author.as_deref().unwrap_or(""),
    ] {
        hasher.update(part.as_bytes());
        hasher.update([0u8]);
    }
    hasher.update(item.metadata.to_string().as_bytes());
    crate::contract::text::hex(&hasher.finalize())
}

fn to_document(source: &str, item: Item, content_hash: String, spec: ChunkSpec) -> NewDocument {
    let updated_at = normalize_date(&item.updated_at).unwrap_or_else(super::now_rfc3339);
    let created_at = item.created_at.as_deref().and_then(normalize_date).unwrap_or_else(|| updated_at.clone());
    let chunks = chunk(&item.body, spec);
    NewDocument {
        id: document_id(source, &item.source_id),
        source: source.to_string(),
        source_id: item.source_id,
        title: item.title,
        body: item.body,
        content_type: item.content_type,
        source_url: item.source_url,
        author: item.author,
        created_at,
        updated_at,
        metadata: item.metadata,
        content_hash,
        chunks,
        vectors: None,
    }
}

/// Syncs every configured source that `target` names: `all`, a type, or one `type:name`.
pub fn sync_target(
    kb: &super::Kb,
    target: &str,
    options: SyncOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Vec<SourceSummary>, super::KbError> {
    let configured = kb.configured_sources();
    let selected: Vec<&String> = configured
        .iter()
        .map(|(name, _)| name)
        // `all`, a type, `type:name`, or a bare name (`docs`), as `--source` takes it.
        .filter(|name| {
            target == "all"
                || *name == target
                || name
                    .split_once(':')
                    .is_some_and(|(ty, bare)| ty == target || (!target.contains(':') && bare == target))
        })
        .collect();
    let is_type = matches!(target, "all" | "filesystem" | "git" | "script");
    if selected.is_empty() && !is_type {
        return Err(super::KbError::UnknownTarget {
            given: target.to_string(),
            known: configured.into_iter().map(|(n, _)| n).collect(),
        });
    }
    let config = kb.config().clone();
    let spec = kb.chunk_spec();
    // A provider that cannot be set up costs semantic search only: keyword indexing goes on,
    // and each source's summary says why it has no vectors.
    // With `[embedding] background`, sync computes no vector: keyword search has the documents
    // at once, and `ctx serve` (or `ctx embed`) fills the vectors after.
    let (embedder, embed_setup) = match kb.embedder() {
        Ok(_) if kb.embeds_in_background() => (None, None),
        Ok(e) => (e, None),
        Err(e) => (None, Some(e.to_string())),
    };
    let mut summaries = Vec::new();
    for source in selected {
        let (kind, name) = source.split_once(':').unwrap_or(("", source));
        let mut scan = |sink: &mut Sink<'_>| -> Result<(), ConnectorError> {
            match kind {
                "filesystem" => {
                    let cfg =
                        config.spec.connectors.filesystem.iter().find(|(n, _)| n.as_str() == name).map(|(_, c)| c);
                    let cfg = cfg.ok_or_else(|| ConnectorError::Source(format!("{source} is not configured")))?;
                    crate::connectors::filesystem::FilesystemConnector { name, config: cfg, base_dir: &config.base_dir }
                        .scan(sink)
                }
                "git" => {
                    let cfg = config.spec.connectors.git.iter().find(|(n, _)| n.as_str() == name).map(|(_, c)| c);
                    let cfg = cfg.ok_or_else(|| ConnectorError::Source(format!("{source} is not configured")))?;
                    let cache_dir = git_cache_dir(&config);
                    crate::connectors::git::GitConnector {
                        name,
                        config: cfg,
                        base_dir: &config.base_dir,
                        cache_dir: &cache_dir,
                    }
                    .scan(sink)
                    .map(|info| tracing::info!(source, commit = %info.commit, branch = %info.branch, "scanned"))
                }
                "script" => {
                    let kind = crate::config::ScriptKind::Connector;
                    let section = config.scripts_of(kind).find(|s| s.name == name).ok_or_else(|| {
                        match config.broken_of(kind).find(|b| b.name == name) {
                            Some(broken) => ConnectorError::Source(broken.message()),
                            None => ConnectorError::Source(format!("{source} is not configured")),
                        }
                    })?;
                    let connector = crate::connectors::lua::LuaConnector::for_section(&config, section);
                    // A full sync starts the script over too, as on its first sync.
                    let connector = if options.full {
                        connector.afresh()
                    } else {
                        connector.with_saved(kb.store().connector_state(source).map_err(|e| {
                            ConnectorError::Source(format!("cannot read the state this connector saved: {e}"))
                        })?)
                    };
                    connector.scan(sink).map(|_| ())
                }
                other => Err(ConnectorError::Source(format!("unknown connector type {other:?}"))),
            }
        };
        let commit = if kind == "script" { Commit::Whole } else { Commit::Batches };
        let allow_shrink = options.allow_shrink || allows_shrink(&config, kind, name);
        let mut summary = sync_source(
            Index { store: kb.store(), embedder: embedder.as_deref() },
            source,
            spec,
            SyncOptions { allow_shrink, ..options },
            commit,
            &mut scan,
            progress,
        );
        if summary.embed_error.is_none() && !options.dry_run {
            summary.embed_error.clone_from(&embed_setup);
        }
        summaries.push(summary);
    }
    Ok(summaries)
}

/// The `allow_shrink` setting of the `kind` source `name`.
fn allows_shrink(config: &crate::config::Config, kind: &str, name: &str) -> bool {
    let connectors = &config.spec.connectors;
    match kind {
        "filesystem" => connectors.filesystem.iter().any(|(n, c)| n.as_str() == name && c.allow_shrink),
        "git" => connectors.git.iter().any(|(n, c)| n.as_str() == name && c.allow_shrink),
        "script" => connectors.script.iter().any(|(n, c)| n.as_str() == name && c.allow_shrink),
        _ => false,
    }
}

/// Clones of remote git sources live next to the database.
fn git_cache_dir(config: &crate::config::Config) -> std::path::PathBuf {
    config.db_path().parent().map(|p| p.join("git-cache")).unwrap_or_else(|| config.base_dir.join("git-cache"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrinking_below_half_is_refused_with_how_to_allow_it() {
        assert_eq!(shrink_refusal("filesystem:docs", 10, 0), None);
        assert_eq!(shrink_refusal("filesystem:docs", 10, 5), None, "half is kept");
        assert_eq!(shrink_refusal("filesystem:docs", 0, 0), None);
        let none = shrink_refusal("script:jira", 1204, 1204).unwrap();
        assert!(none.starts_with("the scan returned none of the 1,204 document(s)"), "{none}");
        assert!(none.contains("`ctx sync script:jira --allow-shrink`"), "{none}");
        assert!(none.contains("[connectors.script.jira]"), "{none}");
        let most = shrink_refusal("git:code", 10, 6).unwrap();
        assert!(most.starts_with("the scan found only 4 of the 10 documents"), "{most}");
        assert!(most.contains("not deleting the other 6"), "{most}");
    }

    #[test]
    fn counts_are_grouped_by_thousands() {
        assert_eq!(
            [0, 999, 1000, 1204, 1234567].map(grouped),
            ["0", "999", "1,000", "1,204", "1,234,567"].map(String::from)
        );
    }
}
