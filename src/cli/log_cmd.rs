//! `ctx log`: read the tool-call log, filter it, follow it.

use std::time::{Duration, SystemTime};

use super::{CliError, Globals};
use crate::calllog::{self, Filter, Settings, Store};
use crate::lua::api::log::one_line;
use crate::types::{CallRecord, CallsResponse};

#[derive(Debug, clap::Args)]
pub struct LogArgs {
    /// Only calls of this tool.
    #[arg(long, value_name = "TOOL")]
    pub tool: Option<String>,
    /// Only calls made for this scoped token ([[server.tokens]] name).
    #[arg(long, value_name = "NAME")]
    pub caller: Option<String>,
    /// Only calls since then: an age (30s, 10m, 2h, 7d), a date or an RFC 3339 time.
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,
    /// Only calls that failed (an error, or a tool that reported a failure).
    #[arg(long)]
    pub errors: bool,
    /// How many of the newest matching calls to show.
    #[arg(long, default_value_t = 50, value_name = "N")]
    pub limit: usize,
    /// Print JSON (with -f, one call per line).
    #[arg(long)]
    pub json: bool,
    /// Keep printing calls as they are logged, until interrupted.
    #[arg(short, long)]
    pub follow: bool,
}

/// How often `-f` looks for new entries.
const POLL: Duration = Duration::from_millis(300);

pub fn run(args: LogArgs, globals: &Globals) -> Result<(), CliError> {
    let config = globals.load_config()?;
    let path = Settings::path_of(&config);
    let since = match &args.since {
        Some(text) => Some(calllog::parse_since(text, SystemTime::now()).map_err(CliError::Usage)?),
        None => None,
    };
    if args.limit == 0 || args.limit > 100_000 {
        return Err(CliError::Usage(format!("--limit {} is out of range: give 1 to 100000", args.limit)));
    }
    let store = Store::open_existing(&path)
        .map_err(|e| CliError::Failed(anyhow::anyhow!("cannot read the tool-call log {}: {e}", path.display())))?;
    let Some(store) = store else {
        if !config.spec.log.enabled {
            eprintln!("the tool-call log is off (log.enabled = false in ctx.toml); nothing was logged");
        } else if !args.json {
            eprintln!("no calls logged yet ({} does not exist)", path.display());
        }
        if args.json && !args.follow {
            println!("{}", serde_json::json!({"calls": []}));
        }
        return Ok(());
    };
    let mut filter = Filter {
        tool: args.tool.clone(),
        caller: args.caller.clone(),
        since,
        errors_only: args.errors,
        before: None,
        after: None,
        limit: args.limit,
    };
    let failed = |e: rusqlite::Error| CliError::Failed(anyhow::anyhow!("cannot read the tool-call log: {e}"));
    let newest = store.query(&filter).map_err(failed)?;
    let mut last = store.newest().map_err(failed)?.unwrap_or(0);
    if args.json && !args.follow {
        let next_before = (newest.len() == args.limit).then(|| newest.last().map(|r| r.seq)).flatten();
        let body = CallsResponse { calls: newest, next_before };
        println!("{}", serde_json::to_string(&body).unwrap_or_default());
        return Ok(());
    }
    // Oldest first, as a log reads.
    for record in newest.iter().rev() {
        print(record, args.json);
    }
    if newest.is_empty() && !args.follow && !args.json {
        eprintln!("no logged call matches");
    }
    if !args.follow {
        return Ok(());
    }
    filter.since = None;
    filter.limit = 1000;
    loop {
        std::thread::sleep(POLL);
        // Up to the newest entry as of now, in pages: nothing committed meanwhile is skipped.
        let newest = store.newest().map_err(failed)?.unwrap_or(last);
        while last < newest {
            filter.after = Some(last);
            filter.before = Some(newest + 1);
            let fresh = store.query(&filter).map_err(failed)?;
            for record in &fresh {
                print(record, args.json);
            }
            // A short page is the end; entries that did not match move the cursor too.
            last = match fresh.last() {
                Some(record) if fresh.len() == filter.limit => record.seq,
                _ => newest,
            };
        }
    }
}

fn print(record: &CallRecord, json: bool) {
    if json {
        println!("{}", serde_json::to_string(record).unwrap_or_default());
        return;
    }
    let at = record.at.format("%Y-%m-%d %H:%M:%S%.3f");
    let who = match &record.caller {
        Some(caller) => format!("{}/{caller}", record.via),
        None => record.via.clone(),
    };
    let params = record.params.as_ref().map(|p| p.to_string()).unwrap_or_default();
    let params = cut(&params, 100);
    let parent = record.parent.map(|p| format!("  (inside call {p})")).unwrap_or_default();
    let (tool, who) = (cut(&record.tool, 60), cut(&who, 60));
    println!("{at}  {:<12} {:>9.1} ms  {tool:<20} {who:<10} {params}{parent}", record.outcome, record.ms);
    if let Some(message) = &record.message {
        println!("    {}", cut(message, 300));
    }
}

/// At most `max` characters, control characters and bidirectional controls escaped (as
/// [`one_line`] escapes them): what a client sent never drives the operator's terminal, nor
/// reorders the parameters the operator reads.
fn cut(text: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        out.push_str(&one_line(c.encode_utf8(&mut [0; 4])));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_escapes_controls_and_bidi_overrides_and_counts_characters() {
        assert_eq!(cut("pay \u{202e}evil\u{202c} now\n", 100), "pay \\u{202e}evil\\u{202c} now\\n");
        assert_eq!(cut("a\u{2067}bcdef", 3), "a\\u{2067}b…");
    }
}
