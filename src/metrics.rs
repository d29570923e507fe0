//! Metrics in the Prometheus text format (`GET /metrics`): calls by tool and outcome with
//! latency histograms, counted on the call path with atomics only; upstream states, syncs,
//! approvals and the call log's own counters, read when scraped.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Latency buckets, in seconds: from an inline search to an agent's long deploy.
const BUCKETS: [f64; 15] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Outcomes a call can have: `ok`, `tool_error` (the tool reported a failure in its result),
/// and each error code.
const OUTCOMES: [&str; 20] = [
    "ok",
    "tool_error",
    "bad_request",
    "unauthorized",
    "forbidden",
    "not_found",
    "method_not_allowed",
    "timeout",
    "payload_too_large",
    "unsupported_media_type",
    "memory_limit",
    "result_too_large",
    "cancelled",
    "rate_limited",
    "unavailable",
    "load_failed",
    "internal",
    "approval_required",
    "approval_refused",
    "conflict",
];

/// Tool names tracked at most: the registry bounds them, this bounds a config with a great
/// many upstream tools. Past it, calls count under `tool="(other)"`.
const MAX_TOOLS: usize = 10_000;

/// One tool's counters.
struct ToolStats {
    outcomes: [AtomicU64; OUTCOMES.len()],
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    micros: AtomicU64,
}

impl ToolStats {
    fn new() -> ToolStats {
        ToolStats {
            outcomes: std::array::from_fn(|_| AtomicU64::new(0)),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            micros: AtomicU64::new(0),
        }
    }
}

/// The call counters of one application (see `tools::CallState`): what `/metrics` shows.
pub struct Metrics {
    /// Whether calls are counted (`server.metrics`): off, the call path skips even the atomics.
    on: AtomicBool,
    tools: RwLock<HashMap<String, Arc<ToolStats>>>,
    /// Tells this application's counters from another's in a thread's cache.
    id: u64,
}

impl Default for Metrics {
    fn default() -> Metrics {
        // Static: an id counter: Metrics ids must be unique across every application in the process.
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Metrics { on: AtomicBool::new(true), tools: RwLock::default(), id: NEXT.fetch_add(1, Ordering::Relaxed) }
    }
}

impl Metrics {
    /// Turns counting on or off (from `server.metrics`, at start and on reload).
    pub fn set_enabled(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// Counts one finished call. `tool` must be a registered name (an unknown name is counted
    /// as `(unknown)`, so a client cannot grow the label set).
    pub fn call(&self, tool: &str, known: bool, outcome: &str, micros: u64) {
        if !self.on.load(Ordering::Relaxed) {
            return;
        }
        let tool = if known { tool } else { "(unknown)" };
        // An outcome this list lacks would be a bug: counted as internal rather than lost.
        let index =
            OUTCOMES.iter().position(|o| *o == outcome).or_else(|| OUTCOMES.iter().position(|o| *o == "internal"));
        let Some(index) = index else { return };
        self.with_stats(tool, |stats| {
            stats.outcomes[index].fetch_add(1, Ordering::Relaxed);
            let seconds = micros as f64 / 1e6;
            if let Some(bucket) = BUCKETS.iter().position(|b| seconds <= *b) {
                stats.buckets[bucket].fetch_add(1, Ordering::Relaxed);
            }
            stats.count.fetch_add(1, Ordering::Relaxed);
            stats.micros.fetch_add(micros, Ordering::Relaxed);
        });
    }

    /// Runs `count` on the counters of `tool`, made on its first call. Each thread keeps the
    /// ones it has used, so a call touches no shared lock or reference count, only the counters
    /// themselves (entries are never removed from the map, so a kept one is the one scrapes
    /// read).
    fn with_stats(&self, tool: &str, count: impl FnOnce(&ToolStats)) {
        // Static: per thread, a cache keyed by the Metrics id: a thread never counts into another application's map.
        thread_local! {
            // A cache of one application's counters (the id says whose): a thread that serves
            // two applications in turn reads the map again when it switches.
            static SEEN: std::cell::RefCell<(u64, HashMap<String, Arc<ToolStats>>)> = Default::default();
        }
        let mut count = Some(count);
        SEEN.with_borrow(|(id, seen)| {
            if let Some(stats) = seen.get(tool).filter(|_| *id == self.id) {
                if let Some(count) = count.take() {
                    count(stats);
                }
            }
        });
        let Some(count) = count else { return };
        let stats = {
            let map = self.tools.read().unwrap_or_else(|p| p.into_inner());
            map.get(tool).cloned()
        };
        let stats = stats.unwrap_or_else(|| {
            let mut map = self.tools.write().unwrap_or_else(|p| p.into_inner());
            let key = if map.len() >= MAX_TOOLS && !map.contains_key(tool) { "(other)" } else { tool };
            Arc::clone(map.entry(key.to_string()).or_insert_with(|| Arc::new(ToolStats::new())))
        });
        count(&stats);
        SEEN.with_borrow_mut(|(id, seen)| {
            if *id != self.id {
                seen.clear();
                *id = self.id;
            }
            // Bounded like the map: past it, a thread looks the rest up each time.
            if seen.len() < MAX_TOOLS {
                seen.insert(tool.to_string(), stats);
            }
        });
    }

    /// The whole exposition, with the call log's own counters.
    pub fn render(&self, scraped: &Scraped, log: &crate::calllog::Counters) -> String {
        let mut out = String::with_capacity(4096);
        // Writing to a String cannot fail.
        let _ = write_all(self, &mut out, scraped, log);
        out
    }
}

/// What the scrape reads from elsewhere.
#[derive(Default)]
pub struct Scraped {
    pub upstreams: Vec<crate::upstream::Status>,
    pub sources: Vec<crate::kb::store::SourceRow>,
    pub approvals_pending: u64,
    pub connections: u64,
    pub mcp_sessions: u64,
}

fn write_all(metrics: &Metrics, out: &mut String, s: &Scraped, log: &crate::calllog::Counters) -> std::fmt::Result {
    writeln!(out, "# HELP ctx_build_info The running ctx.")?;
    writeln!(out, "# TYPE ctx_build_info gauge")?;
    writeln!(out, "ctx_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"))?;

    let mut tools: Vec<(String, Arc<ToolStats>)> = {
        let map = metrics.tools.read().unwrap_or_else(|p| p.into_inner());
        map.iter().map(|(k, v)| (k.clone(), Arc::clone(v))).collect()
    };
    tools.sort_by(|a, b| a.0.cmp(&b.0));
    writeln!(out, "# HELP ctx_tool_calls_total Tool calls by tool and outcome (ok, tool_error, or the error code).")?;
    writeln!(out, "# TYPE ctx_tool_calls_total counter")?;
    for (tool, stats) in &tools {
        for (i, outcome) in OUTCOMES.iter().enumerate() {
            let n = stats.outcomes[i].load(Ordering::Relaxed);
            if n > 0 {
                writeln!(out, "ctx_tool_calls_total{{tool=\"{}\",outcome=\"{outcome}\"}} {n}", escape(tool))?;
            }
        }
    }
    writeln!(out, "# HELP ctx_tool_call_duration_seconds How long tool calls took.")?;
    writeln!(out, "# TYPE ctx_tool_call_duration_seconds histogram")?;
    for (tool, stats) in &tools {
        let tool = escape(tool);
        let mut cumulative = 0;
        for (i, bound) in BUCKETS.iter().enumerate() {
            cumulative += stats.buckets[i].load(Ordering::Relaxed);
            writeln!(out, "ctx_tool_call_duration_seconds_bucket{{tool=\"{tool}\",le=\"{bound}\"}} {cumulative}")?;
        }
        let count = stats.count.load(Ordering::Relaxed);
        writeln!(out, "ctx_tool_call_duration_seconds_bucket{{tool=\"{tool}\",le=\"+Inf\"}} {count}")?;
        let sum = stats.micros.load(Ordering::Relaxed) as f64 / 1e6;
        writeln!(out, "ctx_tool_call_duration_seconds_sum{{tool=\"{tool}\"}} {sum}")?;
        writeln!(out, "ctx_tool_call_duration_seconds_count{{tool=\"{tool}\"}} {count}")?;
    }

    writeln!(out, "# HELP ctx_upstream_up Whether an upstream MCP server is ready (1) or not (0).")?;
    writeln!(out, "# TYPE ctx_upstream_up gauge")?;
    for u in &s.upstreams {
        let up = u8::from(u.state == crate::upstream::State::Ready);
        writeln!(out, "ctx_upstream_up{{server=\"{}\"}} {up}", escape(&u.name))?;
    }
    writeln!(out, "# HELP ctx_upstream_state An upstream MCP server's state: 1 for the state it is in.")?;
    writeln!(out, "# TYPE ctx_upstream_state gauge")?;
    for u in &s.upstreams {
        use crate::upstream::State;
        for (state, name) in [
            (State::Connecting, "connecting"),
            (State::Ready, "ready"),
            (State::Restarting, "restarting"),
            (State::CrashLooping, "crash_looping"),
            (State::Disabled, "disabled"),
        ] {
            let on = u8::from(u.state == state);
            writeln!(out, "ctx_upstream_state{{server=\"{}\",state=\"{name}\"}} {on}", escape(&u.name))?;
        }
    }
    writeln!(out, "# HELP ctx_upstream_restarts_total Restarts of an upstream MCP server since ctx started.")?;
    writeln!(out, "# TYPE ctx_upstream_restarts_total counter")?;
    for u in &s.upstreams {
        writeln!(out, "ctx_upstream_restarts_total{{server=\"{}\"}} {}", escape(&u.name), u.restarts)?;
    }
    writeln!(out, "# HELP ctx_upstream_tools Tools an upstream MCP server lists.")?;
    writeln!(out, "# TYPE ctx_upstream_tools gauge")?;
    for u in &s.upstreams {
        writeln!(out, "ctx_upstream_tools{{server=\"{}\"}} {}", escape(&u.name), u.tools)?;
    }

    writeln!(out, "# HELP ctx_source_syncs_total Syncs of a source (by any ctx process on this database).")?;
    writeln!(out, "# TYPE ctx_source_syncs_total counter")?;
    for r in &s.sources {
        writeln!(out, "ctx_source_syncs_total{{source=\"{}\"}} {}", escape(&r.source), r.syncs)?;
    }
    writeln!(out, "# HELP ctx_source_sync_failures_total Syncs of a source that failed.")?;
    writeln!(out, "# TYPE ctx_source_sync_failures_total counter")?;
    for r in &s.sources {
        writeln!(out, "ctx_source_sync_failures_total{{source=\"{}\"}} {}", escape(&r.source), r.failures)?;
    }
    writeln!(out, "# HELP ctx_source_last_sync_duration_seconds How long a source's last sync took.")?;
    writeln!(out, "# TYPE ctx_source_last_sync_duration_seconds gauge")?;
    for r in &s.sources {
        if let Some(ms) = r.last_duration_ms {
            let secs = ms as f64 / 1000.0;
            writeln!(out, "ctx_source_last_sync_duration_seconds{{source=\"{}\"}} {secs}", escape(&r.source))?;
        }
    }
    writeln!(out, "# HELP ctx_source_last_sync_timestamp_seconds When a source last synced (Unix time).")?;
    writeln!(out, "# TYPE ctx_source_last_sync_timestamp_seconds gauge")?;
    for r in &s.sources {
        let at = r.last_sync.as_deref().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
        if let Some(at) = at {
            let secs = at.timestamp_millis() as f64 / 1000.0;
            writeln!(out, "ctx_source_last_sync_timestamp_seconds{{source=\"{}\"}} {secs}", escape(&r.source))?;
        }
    }
    writeln!(out, "# HELP ctx_source_documents Documents indexed from a source.")?;
    writeln!(out, "# TYPE ctx_source_documents gauge")?;
    for r in &s.sources {
        writeln!(out, "ctx_source_documents{{source=\"{}\"}} {}", escape(&r.source), r.documents)?;
    }
    writeln!(out, "# HELP ctx_source_chunks Chunks indexed from a source.")?;
    writeln!(out, "# TYPE ctx_source_chunks gauge")?;
    for r in &s.sources {
        writeln!(out, "ctx_source_chunks{{source=\"{}\"}} {}", escape(&r.source), r.chunks)?;
    }

    writeln!(out, "# HELP ctx_approvals_pending Tool calls waiting for a person to approve or deny them.")?;
    writeln!(out, "# TYPE ctx_approvals_pending gauge")?;
    writeln!(out, "ctx_approvals_pending {}", s.approvals_pending)?;

    let written = log.written.load(Ordering::Relaxed);
    let dropped = log.dropped.load(Ordering::Relaxed);
    let failed = log.write_errors.load(Ordering::Relaxed);
    let queued = log.queued.load(Ordering::Relaxed);
    writeln!(out, "# HELP ctx_call_log_written_total Entries the tool-call log wrote.")?;
    writeln!(out, "# TYPE ctx_call_log_written_total counter")?;
    writeln!(out, "ctx_call_log_written_total {written}")?;
    writeln!(
        out,
        "# HELP ctx_call_log_dropped_total Entries of read-only calls dropped because the log's writer was behind."
    )?;
    writeln!(out, "# TYPE ctx_call_log_dropped_total counter")?;
    writeln!(out, "ctx_call_log_dropped_total {dropped}")?;
    writeln!(
        out,
        "# HELP ctx_call_log_refused_total Calls refused (audit_unavailable) because the log could not take the entry they must have before they answer."
    )?;
    writeln!(out, "# TYPE ctx_call_log_refused_total counter")?;
    writeln!(out, "ctx_call_log_refused_total {}", log.refused.load(Ordering::Relaxed))?;
    writeln!(out, "# HELP ctx_call_log_write_errors_total Entries lost to a failed write.")?;
    writeln!(out, "# TYPE ctx_call_log_write_errors_total counter")?;
    writeln!(out, "ctx_call_log_write_errors_total {failed}")?;
    writeln!(out, "# HELP ctx_call_log_queue Entries waiting for the log's writer.")?;
    writeln!(out, "# TYPE ctx_call_log_queue gauge")?;
    writeln!(out, "ctx_call_log_queue {}", queued.saturating_sub(written + failed))?;

    writeln!(out, "# HELP ctx_http_connections Open HTTP connections.")?;
    writeln!(out, "# TYPE ctx_http_connections gauge")?;
    writeln!(out, "ctx_http_connections {}", s.connections)?;
    writeln!(out, "# HELP ctx_mcp_sessions Open MCP sessions.")?;
    writeln!(out, "# TYPE ctx_mcp_sessions gauge")?;
    writeln!(out, "ctx_mcp_sessions {}", s.mcp_sessions)?;
    Ok(())
}

/// A label value as the text format wants it: backslash, quote and newline escaped.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_count_by_outcome_and_fall_in_their_buckets() {
        let metrics = Metrics::default();
        metrics.call("metrics-test-tool", true, "ok", 700);
        metrics.call("metrics-test-tool", true, "rate_limited", 20_000);
        metrics.call("no-such-tool-xyz", false, "not_found", 10);
        let text = metrics.render(&Scraped::default(), &crate::calllog::Counters::default());
        assert!(text.contains("ctx_tool_calls_total{tool=\"metrics-test-tool\",outcome=\"ok\"} 1"), "{text}");
        assert!(text.contains("ctx_tool_calls_total{tool=\"metrics-test-tool\",outcome=\"rate_limited\"} 1"));
        assert!(text.contains("ctx_tool_call_duration_seconds_bucket{tool=\"metrics-test-tool\",le=\"0.0005\"} 0"));
        assert!(text.contains("ctx_tool_call_duration_seconds_bucket{tool=\"metrics-test-tool\",le=\"0.001\"} 1"));
        assert!(text.contains("ctx_tool_call_duration_seconds_bucket{tool=\"metrics-test-tool\",le=\"0.025\"} 2"));
        assert!(text.contains("ctx_tool_call_duration_seconds_count{tool=\"metrics-test-tool\"} 2"));
        assert!(!text.contains("no-such-tool-xyz"), "unknown names stay out of the labels");
        assert!(text.contains("tool=\"(unknown)\",outcome=\"not_found\""));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
