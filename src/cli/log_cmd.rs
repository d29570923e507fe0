//! `ctx log`: read the tool-call log, filter it, follow it.

use std::time::{Duration, SystemTime};

use super::{CliError, Globals};
use crate::calllog::{self, Filter, Settings, Store, StoreError};
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
    // The shared database's log when the config names one (every replica's calls), else the file.
    let shared = crate::app::database::open(&config, crate::app::database::Role::Command)
        .map_err(|e| CliError::Failed(anyhow::anyhow!(e)))?;
    let store = match &shared {
        Some(shared) => Some(Store::shared(shared.pg.clone(), shared.replica.clone())),
        None => Store::open_existing(&path)
            .map_err(|e| CliError::Failed(anyhow::anyhow!("cannot read the tool-call log {}: {e}", path.display())))?,
    };
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
    let failed = |e: StoreError| CliError::Failed(anyhow::anyhow!("cannot read the tool-call log: {e}"));
    let newest = store.query(&filter).map_err(failed)?;
    let mut last = store.newest().map_err(failed)?.unwrap_or(0);
    if args.json && !args.follow {
        let next_before = (newest.len() == args.limit).then(|| newest.last().map(|r| r.seq)).flatten();
        let body = CallsResponse { calls: newest, next_before };
        println!("{}", serde_json::to_string(&body).unwrap_or_default());
        return Ok(());
    }
    // Oldest first, as a log reads.
    let mut columns = Columns::new();
    print(&newest.iter().rev().collect::<Vec<_>>(), args.json, &mut columns);
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
            print(&fresh.iter().collect::<Vec<_>>(), args.json, &mut columns);
            // A short page is the end; entries that did not match move the cursor too.
            last = match fresh.last() {
                Some(record) if fresh.len() == filter.limit => record.seq,
                _ => newest,
            };
        }
    }
}

/// One call as the text output shows it, its fields cut and escaped.
struct Row {
    at: String,
    outcome: String,
    ms: f64,
    tool: String,
    who: String,
    /// The replica that served it, in the shared database's log.
    replica: Option<String>,
    params: String,
    parent: String,
    message: Option<String>,
}

impl Row {
    fn of(record: &CallRecord) -> Row {
        let who = match &record.caller {
            Some(caller) => format!("{}/{caller}", record.via),
            None => record.via.clone(),
        };
        let params = record.params.as_ref().map(|p| p.to_string()).unwrap_or_default();
        Row {
            at: record.at.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
            outcome: cut(&record.outcome, 40),
            ms: record.ms,
            tool: cut(&record.tool, 60),
            who: cut(&who, 60),
            replica: record.replica.as_deref().map(|r| cut(r, 60)),
            params: cut(&params, 100),
            parent: record.parent.map(|p| format!("  (inside call {p})")).unwrap_or_default(),
            message: record.message.as_deref().map(|m| cut(m, 300)),
        }
    }
}

/// The widths of the text output's padded columns: the widest value shown so far, and at least
/// what the usual values take (the longest outcome a call commonly has is `approval_required`),
/// so the rows `-f` prints later line up with the first page too.
struct Columns {
    outcome: usize,
    tool: usize,
    who: usize,
    replica: usize,
}

impl Columns {
    fn new() -> Columns {
        Columns { outcome: "approval_required".len(), tool: 20, who: 10, replica: 0 }
    }

    fn fit(&mut self, rows: &[Row]) {
        for row in rows {
            self.outcome = self.outcome.max(row.outcome.chars().count());
            self.tool = self.tool.max(row.tool.chars().count());
            self.who = self.who.max(row.who.chars().count());
            self.replica = self.replica.max(row.replica.as_ref().map_or(0, |r| r.chars().count()));
        }
    }

    fn print(&self, row: &Row) {
        let Columns { outcome, tool, who, replica } = self;
        // The replica column only in the shared database's log: a file's lines stay as they were.
        let served = match &row.replica {
            Some(name) => format!("{name:<replica$} "),
            None => String::new(),
        };
        println!(
            "{}  {:<outcome$} {:>9.1} ms  {:<tool$} {:<who$} {served}{}{}",
            row.at, row.outcome, row.ms, row.tool, row.who, row.params, row.parent
        );
        if let Some(message) = &row.message {
            println!("    {message}");
        }
    }
}

/// Prints `records` in order: JSON lines, or rows in columns fitted to them.
fn print(records: &[&CallRecord], json: bool, columns: &mut Columns) {
    if json {
        for record in records {
            println!("{}", serde_json::to_string(record).unwrap_or_default());
        }
        return;
    }
    let rows: Vec<Row> = records.iter().map(|r| Row::of(r)).collect();
    columns.fit(&rows);
    for row in &rows {
        columns.print(row);
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
