//! `ctx embed`: give every chunk a vector of the configured model (a backfill after
//! `[embedding]` was set up or changed); `ctx sync` runs the same step after its sources.

use std::io::IsTerminal;

use super::{CliError, Globals};
use crate::kb::embedding::{self, Backfill};
use crate::kb::Kb;

#[derive(Debug, clap::Args)]
pub struct EmbedArgs {
    /// Print a JSON summary instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: EmbedArgs, globals: &Globals) -> Result<(), CliError> {
    let kb = super::kb_cmd::open(globals)?;
    let Some(embedder) = kb.embedder().map_err(|e| CliError::Failed(e.into()))? else {
        return Err(CliError::Usage(
            "[embedding] provider is \"disabled\": set provider = \"local\" with path = \"<model folder>\" \
             (scripts/get-model installs one), or \"ollama\" / \"openai\" with model and dims, then run ctx embed again"
                .to_string(),
        ));
    };
    let done = backfill(&kb, !args.json && !globals.quiet)?.unwrap_or_default();
    if args.json {
        let json = serde_json::json!({"model": embedder.name(), "dims": embedder.dims(), "embedded": done.embedded, "replaced": done.replaced});
        println!("{json}");
    } else if done.embedded == 0 && !globals.quiet {
        println!("every chunk already has a vector of {}", embedder.name());
    }
    Ok(())
}

/// Embeds the chunks that have no vector of the configured model, with a progress bar on a
/// terminal. `None` when no embedder is configured. `report` prints what happened.
pub(super) fn backfill(kb: &Kb, report: bool) -> Result<Option<Backfill>, CliError> {
    let Some(embedder) = kb.embedder().map_err(|e| CliError::Failed(e.into()))? else { return Ok(None) };
    let (missing, others) =
        embedding::pending(kb.store(), embedder.as_ref()).map_err(|e| CliError::Failed(e.into()))?;
    if missing == 0 {
        return Ok(Some(Backfill::default()));
    }
    if report {
        if others.is_empty() {
            eprintln!("embedding {missing} chunk(s) with {}", embedder.name());
        } else {
            eprintln!(
                "the embedding model changed: the index has vectors of {}, the config names {}; re-embedding {missing} chunk(s)",
                others.join(", "),
                embedder.name()
            );
        }
    }
    let bar = (report && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(missing as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} chunks embedded ({per_sec}, {eta} left)")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let started = std::time::Instant::now();
    let done = embedding::backfill(kb.store(), embedder.as_ref(), &mut |done, total| {
        if let Some(bar) = &bar {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        }
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let done = done.map_err(|e| {
        CliError::Failed(anyhow::anyhow!(
            "{e}\nthe chunks embedded so far are kept; run `ctx embed` to go on once the provider works"
        ))
    })?;
    if report {
        eprintln!(
            "embedded {} chunk(s) with {} in {:.2}s",
            done.embedded,
            embedder.name(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(Some(done))
}
