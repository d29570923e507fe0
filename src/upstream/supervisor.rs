//! One server's supervisor task: connect, list, serve until the connection is gone, then
//! restart with exponential backoff, or slowly once it is crash-looping. It owns the
//! connection; calls borrow a clone of its peer from the shared state.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rmcp::model::{ClientRequest, PingRequest};
use rmcp::service::{Peer, RoleClient};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::catalog::{self, Lists};
use super::client::{self, Changes, Connection, Cut, ProgressRouter, PROMPTS, RESOURCES, TOOLS};
use super::sniff::Executions;
use super::{Event, EventSink, State, Tuning};
use crate::config::upstream::{UpstreamSection, UpstreamTransport, DEFAULT_PASS_ENV};

/// The longest error message kept for `/health`.
const MAX_ERROR: usize = 500;
/// Recent call durations kept for the median.
const LATENCY_RING: usize = 128;

/// What the supervisor, the callers and `/health` share about one server.
pub struct Shared {
    pub section: UpstreamSection,
    pub progress: Arc<ProgressRouter>,
    /// The tools' `execution`, which rmcp's listing drops (see [`super::sniff`]).
    pub executions: Arc<Executions>,
    inner: Mutex<Inner>,
    /// Bumped on every state change (for `required_ready`).
    pub changed: watch::Sender<u64>,
}

pub struct Inner {
    pub state: State,
    pub attempt: u32,
    pub restarts: u64,
    pub last_error: Option<String>,
    pub pid: Option<u32>,
    pub peer: Option<Peer<RoleClient>>,
    /// The ready connection's [`Cut`]: why ctx ended it, for the calls it ended.
    pub cut: Option<Cut>,
    pub lists: Lists,
    /// Attempts that failed since start (for `required_ready`).
    pub failed_attempts: u32,
    /// Tools listed at the last connect, to notice a server that comes back empty.
    pub tools_when_last_ready: usize,
    pub calls: u64,
    latencies: VecDeque<f64>,
}

impl Shared {
    pub fn new(section: UpstreamSection) -> Arc<Shared> {
        let state = if section.enabled { State::Connecting } else { State::Disabled };
        Arc::new(Shared {
            section,
            progress: Arc::default(),
            executions: Arc::default(),
            inner: Mutex::new(Inner {
                state,
                attempt: 0,
                restarts: 0,
                last_error: None,
                pid: None,
                peer: None,
                cut: None,
                lists: Lists::default(),
                failed_attempts: 0,
                tools_when_last_ready: 0,
                calls: 0,
                latencies: VecDeque::new(),
            }),
            changed: watch::channel(0).0,
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut Inner)) {
        f(&mut self.lock());
        self.changed.send_modify(|n| *n += 1);
    }

    /// Records one finished call.
    pub fn record_call(&self, took: Duration) {
        let mut inner = self.lock();
        inner.calls += 1;
        if inner.latencies.len() == LATENCY_RING {
            inner.latencies.pop_front();
        }
        inner.latencies.push_back(took.as_secs_f64() * 1000.0);
    }

    /// The sanitised message: no value of the section's `env` or `headers`, nor of its URL's
    /// query or password (reqwest's errors quote the URL: `?api_key=...` would reach `/health`
    /// and every caller), no Rust type names, at most 500 chars.
    pub fn sanitise(&self, message: &str) -> String {
        let mut secrets: Vec<&str> = match &self.section.transport {
            UpstreamTransport::Stdio { env, .. } => {
                env.iter().filter(|(k, _)| !DEFAULT_PASS_ENV.contains(&k.as_str())).map(|(_, v)| v.as_str()).collect()
            }
            UpstreamTransport::Http { headers, url } => {
                let mut secrets: Vec<&str> = headers.values().map(String::as_str).collect();
                // `Bearer <token>`: the token may be quoted without its scheme.
                secrets.extend(headers.values().filter_map(|v| v.split_once(' ').map(|(_, token)| token.trim())));
                secrets.extend(crate::config::upstream::url_secrets(url));
                secrets
            }
        };
        // Longest first: a value that contains another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        let mut text = strip_type_names(message);
        for secret in secrets {
            // Short values (`1`, `true`) would blank out ordinary words.
            if secret.len() >= 6 {
                text = text.replace(secret, "***");
            }
        }
        // The stderr tail is the server's text: no terminal escape reaches `ctx mcp list`.
        if text.chars().any(char::is_control) {
            text = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        }
        if let Some((cut, _)) = text.char_indices().nth(MAX_ERROR) {
            text.truncate(cut);
            text.push('…');
        }
        text
    }
}

/// rmcp's transport errors name the transport's Rust type (`Transport [ctx::upstream::...<...>]`):
/// noise to a user, left out.
fn strip_type_names(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(" [") {
        let inner = &rest[at + 2..];
        let mut depth = 1usize;
        let end = inner.char_indices().find_map(|(i, c)| {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => {}
            }
            (depth == 0).then_some(i)
        });
        match end {
            Some(end) if inner[..end].contains("::") => {
                out.push_str(&rest[..at]);
                rest = &inner[end + 1..];
            }
            _ => {
                out.push_str(&rest[..at + 2]);
                rest = inner;
            }
        }
    }
    out.push_str(rest);
    out
}

impl Inner {
    pub fn latency_p50_ms(&self) -> Option<f64> {
        if self.latencies.is_empty() {
            return None;
        }
        let mut sorted: Vec<f64> = self.latencies.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        Some(sorted[sorted.len() / 2])
    }
}

/// How a served connection ended.
enum End {
    Stopped,
    Lost(String),
}

/// The supervisor task of one enabled server; returns once `stop` is cancelled and the
/// server is stopped.
pub async fn run(shared: Arc<Shared>, events: EventSink, tuning: Arc<Tuning>, stop: CancellationToken) {
    let name = shared.section.name.clone();
    let mut failures: VecDeque<Instant> = VecDeque::new();
    let mut first = true;
    while !stop.is_cancelled() {
        shared.update(|s| {
            s.attempt += 1;
            if !first {
                s.restarts += 1;
            }
        });
        first = false;
        let changes = Arc::new(Changes::default());
        let attempt = client::connect(
            &shared.section,
            tuning.guard.as_deref(),
            tuning.connect_timeout,
            tuning.stop_grace,
            shared.progress.clone(),
            shared.executions.clone(),
            changes.clone(),
        );
        let outcome = tokio::select! {
            r = attempt => r,
            () = stop.cancelled() => break,
        };
        let failure = match outcome {
            Err(e) => Some(e),
            Ok(conn) => match ready(&shared, &events, &tuning, conn, changes, &stop).await {
                End::Stopped => break,
                End::Lost(why) => Some(why),
            },
        };
        if let Some(why) = failure {
            let why = shared.sanitise(&why);
            tracing::warn!(server = %name, "upstream MCP server failed: {why}");
            shared.update(|s| {
                s.last_error = Some(why);
                s.failed_attempts += 1;
            });
        }
        let now = Instant::now();
        failures.push_back(now);
        while failures.front().is_some_and(|t| now.duration_since(*t) > tuning.crash_loop_window) {
            failures.pop_front();
        }
        let (state, delay) = if failures.len() >= tuning.crash_loop_failures as usize {
            (State::CrashLooping, tuning.crash_loop_retry)
        } else {
            (State::Restarting, backoff(&tuning, failures.len()))
        };
        if state == State::CrashLooping {
            tracing::warn!(server = %name, "upstream MCP server is crash-looping ({} failures within {} s); retrying every {} s", failures.len(), tuning.crash_loop_window.as_secs(), delay.as_secs());
        }
        shared.update(|s| s.state = state);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stop.cancelled() => break,
        }
    }
    shared.update(|s| {
        s.state = State::Disabled;
        s.peer = None;
        s.pid = None;
    });
}

/// Lists the new connection's catalog, marks the server ready, and serves until the
/// connection is lost or `stop` is cancelled; relists on `list_changed`.
async fn ready(
    shared: &Arc<Shared>,
    events: &EventSink,
    tuning: &Tuning,
    mut conn: Connection,
    changes: Arc<Changes>,
    stop: &CancellationToken,
) -> End {
    let name = &shared.section.name;
    let mut lists = Lists::default();
    let listed = tokio::select! {
        r = catalog::relist(&conn.peer, &shared.section, &shared.executions, TOOLS | RESOURCES | PROMPTS, tuning.connect_timeout, &mut lists) => r,
        () = stop.cancelled() => {
            conn.stop(tuning.stop_grace).await;
            return End::Stopped;
        }
    };
    if let Err(e) = listed {
        conn.stop(tuning.stop_grace).await;
        return End::Lost(e);
    }
    let pid = conn.child.as_ref().map(|c| c.server_pid());
    tracing::info!(server = %name, pid, tools = lists.tools.len(), "upstream MCP server ready");
    let before = std::mem::replace(&mut shared.lock().tools_when_last_ready, lists.tools.len());
    if lists.tools.is_empty() && before > 0 {
        // The list is what the server says now (never a stale copy), but say it loudly.
        tracing::warn!(server = %name, "upstream MCP server came back with 0 tools (it had {before})");
    }
    shared.update(|s| {
        s.state = State::Ready;
        s.attempt = 0;
        s.pid = pid;
        s.peer = Some(conn.peer.clone());
        s.cut = Some(conn.cut.clone());
        s.lists = lists;
    });
    events(Event { server: name.clone(), tools: true, resources: true, prompts: true });

    // An HTTP server that restarted while nobody called is noticed by its event stream (see
    // `http`); one without an event stream, or unreachable without a refusal, by this ping.
    let http = matches!(shared.section.transport, UpstreamTransport::Http { .. });
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + tuning.ping_interval, tuning.ping_interval);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end = loop {
        tokio::select! {
            () = stop.cancelled() => break End::Stopped,
            why = conn.closed() => break End::Lost(why),
            _ = ping.tick(), if http => {
                let peer = conn.peer.clone();
                let request = ClientRequest::PingRequest(PingRequest { method: Default::default(), extensions: Default::default() });
                let answered = tokio::select! {
                    () = stop.cancelled() => break End::Stopped,
                    why = conn.closed() => break End::Lost(why),
                    answered = tokio::time::timeout(tuning.connect_timeout, peer.send_request(request)) => answered,
                };
                match answered {
                    // Any answer, an error included (a server without `ping`), says it is there.
                    Ok(Ok(_)) | Ok(Err(rmcp::ServiceError::McpError(_))) => {}
                    Ok(Err(e)) => break End::Lost(format!("the liveness ping failed: {e}")),
                    Err(_) => break End::Lost(format!("no answer to a liveness ping within {} s", tuning.connect_timeout.as_secs_f64())),
                }
            }
            () = changes.notify.notified() => {
                // Debounce: a burst of list_changed becomes one relist.
                tokio::time::sleep(tuning.list_debounce).await;
                let which = changes.take();
                if which == 0 {
                    continue;
                }
                let mut lists = shared.lock().lists.clone();
                let relisted = tokio::select! {
                    r = catalog::relist(&conn.peer, &shared.section, &shared.executions, which, tuning.connect_timeout, &mut lists) => r,
                    () = stop.cancelled() => break End::Stopped,
                };
                match relisted {
                    // A server may send list_changed for nothing, or flood it: an unchanged
                    // list swaps nothing (a swap recompiles every tool's schema) and tells no
                    // client.
                    Ok(()) if shared.lock().lists == lists => {}
                    Ok(()) => {
                        shared.update(|s| s.lists = lists);
                        events(Event {
                            server: name.clone(),
                            tools: which & TOOLS != 0,
                            resources: which & RESOURCES != 0,
                            prompts: which & PROMPTS != 0,
                        });
                    }
                    Err(e) => tracing::warn!(server = %name, "relisting after list_changed failed: {e}"),
                }
            }
        }
    };
    // Not ready any more: calls fail at once from here on, and the lists go empty.
    // Health never shows the server down without the reason.
    let why = match &end {
        End::Lost(why) => Some(shared.sanitise(why)),
        End::Stopped => None,
    };
    let had = {
        let mut s = shared.lock();
        if why.is_some() {
            s.last_error = why;
        }
        s.peer = None;
        s.cut = None;
        s.pid = None;
        s.state = State::Restarting;
        !std::mem::take(&mut s.lists).is_empty()
    };
    shared.changed.send_modify(|n| *n += 1);
    if had {
        events(Event { server: name.clone(), tools: true, resources: true, prompts: true });
    }
    conn.stop(tuning.stop_grace).await;
    end
}

/// The delay before the next attempt after `failures` recent failures: doubling from the
/// base, capped, with ±20 % jitter so that servers that failed together do not retry together.
fn backoff(tuning: &Tuning, failures: usize) -> Duration {
    let exp = failures.saturating_sub(1).min(20) as u32;
    let delay = tuning.backoff_base.saturating_mul(1u32 << exp).min(tuning.backoff_max);
    let jitter = 0.8 + 0.4 * (jitter_seed() % 1000) as f64 / 1000.0;
    delay.mul_f64(jitter)
}

fn jitter_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_credentials_and_type_names_are_left_out() {
        let section = UpstreamSection {
            name: "h".into(),
            transport: UpstreamTransport::Http {
                url: "https://bob:pa55word-x@h.example/mcp?api_key=KEY-123456&mode=fast#frag-secret".into(),
                headers: [("Authorization".to_string(), "Bearer tok-abcdef".to_string())].into(),
            },
            tools: Vec::new(),
            exclude: Vec::new(),
            timeout: Duration::from_secs(1),
            required: false,
            enabled: true,
            expose: crate::config::upstream::Expose::All,
            origin: "ctx.toml".into(),
        };
        let shared = Shared::new(section);
        let said = shared.sanitise(
            "initialize failed: Send message error Transport [ctx::upstream::client::Tap<a::B<c::D>>] error: error sending request for url (https://h.example/mcp?api_key=KEY-123456&mode=fast), pa55word-x, tok-abcdef, frag-secret [kept]\u{1b}]52;c;eA==\u{7}",
        );
        assert_eq!(
            said,
            "initialize failed: Send message error Transport error: error sending request for url (https://h.example/mcp?***), ***, ***, *** [kept] ]52;c;eA== "
        );
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let tuning = Tuning::default();
        let first = backoff(&tuning, 1);
        assert!(first >= Duration::from_millis(400) && first <= Duration::from_millis(600), "{first:?}");
        let third = backoff(&tuning, 3);
        assert!(third >= Duration::from_millis(1600) && third <= Duration::from_millis(2400), "{third:?}");
        assert!(backoff(&tuning, 50) <= Duration::from_secs(36));
    }
}
