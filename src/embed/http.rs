//! What the network providers share: one blocking POST with a timeout, retries with
//! backoff, and `Retry-After` on 429 and 503.
//!
//! `Embedder::embed` is blocking (the CLI and `spawn_blocking` call it from plain threads), but
//! the crate's HTTP client is async: the requests run on ctx's one runtime ([`crate::runtime`]),
//! and the caller's thread waits for them.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use crate::config::redact::{self, Redactor};

/// The longest `Retry-After` ctx sleeps through: a service asking for more is better reported
/// now than waited on with a sync hanging in silence.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The first backoff; each retry doubles it, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// What went wrong, so a provider can say what to do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trouble {
    /// No connection (refused, DNS, TLS, reset).
    Unreachable,
    /// No full answer within `timeout_secs`.
    Timeout,
    /// An HTTP status other than 2xx.
    Status(u16),
}

/// One vector per text, in order.
pub type Vectors = Vec<Vec<f32>>;

/// How one provider speaks: its wire format and its advice. Plain functions, so a request
/// future owns everything it needs.
pub struct Service {
    /// `ollama`, `openai`.
    pub provider: &'static str,
    pub default_url: &'static str,
    /// Appended to the base URL: `api/embed`, `embeddings`.
    pub path: &'static str,
    /// A model and its dimensions, for config messages.
    pub example: (&'static str, usize),
    /// The request body for one batch: `(model, dims, texts)`.
    pub request: fn(&str, usize, &[&str]) -> serde_json::Value,
    /// The vectors of a 2xx answer, in the order of the texts.
    pub vectors: fn(&[u8]) -> Result<Vectors, String>,
    /// The service's own message in an error answer.
    pub error_of: fn(&[u8]) -> Option<String>,
    /// What the user should do: `(trouble, model)`.
    pub advice: fn(Trouble, &str) -> String,
}

/// One service endpoint with its limits. Holds the key: never derive Debug for it.
pub struct Endpoint {
    pub service: &'static Service,
    /// `ollama:nomic-embed-text`: names the provider and the model in every error.
    pub name: String,
    pub model: String,
    pub url: reqwest::Url,
    /// `url` without user or password, for messages.
    pub shown: String,
    pub api_key: Option<String>,
    pub timeout: Duration,
    pub max_retries: u32,
    /// The most bytes read of one answer. It follows from the config (batch_size × dims), not
    /// from what the server claims, so a hostile server cannot exhaust memory.
    pub max_answer: usize,
    /// The key in every form a message could show it; applied to every message we build.
    pub secrets: Redactor,
}

/// How one attempt ended.
enum Outcome {
    Done(Vec<u8>),
    /// Worth another try (timeout, connection, 429, 5xx), maybe after the server's delay.
    Again {
        why: String,
        trouble: Trouble,
        retry_after: Option<Duration>,
    },
    /// Retrying cannot help.
    Fatal {
        why: String,
        trouble: Option<Trouble>,
    },
}

impl Endpoint {
    /// POSTs `body` (JSON), retrying as configured, and returns the 2xx answer's bytes.
    pub fn post(self: &Arc<Self>, body: Vec<u8>) -> Result<Vec<u8>, crate::embed::EmbedError> {
        let me = Arc::clone(self);
        match run(async move { me.post_with_retries(body).await }) {
            Ok(answer) => answer,
            Err(why) => Err(self.fail(&why)),
        }
    }

    /// The provider error for `why`, with the URL, and with the key scrubbed.
    pub fn fail(&self, why: &str) -> crate::embed::EmbedError {
        let message = format!("POST {}: {why}", self.shown);
        let message = redact::string(self.secrets.apply(&message).into_owned());
        crate::embed::EmbedError::Provider { provider: self.name.clone(), message }
    }

    async fn post_with_retries(&self, body: Vec<u8>) -> Result<Vec<u8>, crate::embed::EmbedError> {
        let advise = |trouble: Option<Trouble>| trouble.map(|t| (self.service.advice)(t, &self.model));
        let mut retries = 0u32;
        loop {
            let (why, trouble, retry_after) = match self.attempt(&body).await {
                Outcome::Done(answer) => return Ok(answer),
                Outcome::Fatal { why, trouble } => return Err(self.fail(&join(&why, advise(trouble)))),
                Outcome::Again { why, trouble, retry_after } => (why, trouble, retry_after),
            };
            if retries >= self.max_retries {
                let tries = match retries {
                    0 => "no retries (max_retries = 0)".to_string(),
                    n => format!("gave up after {n} {} (max_retries = {n})", if n == 1 { "retry" } else { "retries" }),
                };
                return Err(self.fail(&join(&format!("{why}; {tries}"), advise(Some(trouble)))));
            }
            let wait = match retry_after {
                Some(wait) if wait > MAX_RETRY_AFTER => {
                    let why = format!(
                        "{why}; the service asks to wait {} s (Retry-After) before retrying, more than the {} s \
                         ctx waits",
                        wait.as_secs(),
                        MAX_RETRY_AFTER.as_secs()
                    );
                    return Err(self.fail(&join(&why, advise(Some(trouble)))));
                }
                Some(wait) => wait,
                None => backoff(retries, jitter()),
            };
            tracing::debug!(provider = %self.name, url = %self.shown, retry = retries + 1, ?wait, "{}", self.secrets.apply(&why));
            tokio::time::sleep(wait).await;
            retries += 1;
        }
    }

    /// One request and its answer, all within the timeout.
    async fn attempt(&self, body: &[u8]) -> Outcome {
        let client = match client() {
            Ok(client) => client,
            Err(why) => return Outcome::Fatal { why, trouble: None },
        };
        let mut request = client
            .post(self.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::ACCEPT, "application/json")
            .body(body.to_vec());
        if let Some(key) = &self.api_key {
            // bearer_auth marks the header sensitive, so reqwest never prints it either.
            request = request.bearer_auth(key);
        }
        let exchange = async {
            let response = request.send().await.map_err(|e| transport(&e))?;
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, SystemTime::now()));
            let location =
                response.headers().get(reqwest::header::LOCATION).and_then(|v| v.to_str().ok()).map(str::to_string);
            let answer = read_capped(response, self.max_answer).await?;
            Ok::<_, Outcome>((status, retry_after, location, answer))
        };
        let (status, retry_after, location, answer) = match tokio::time::timeout(self.timeout, exchange).await {
            Err(_) => {
                let secs = self.timeout.as_secs();
                let why = format!("timed out: no full answer within {secs} s (timeout_secs = {secs})");
                return Outcome::Again { why, trouble: Trouble::Timeout, retry_after: None };
            }
            Ok(Err(outcome)) => return outcome,
            Ok(Ok(parts)) => parts,
        };
        let said = || match (self.service.error_of)(&answer) {
            Some(message) => format!(": {}", one_line(&message)),
            None if answer.is_empty() => String::new(),
            None => format!(": {}", one_line(&String::from_utf8_lossy(&answer))),
        };
        match status {
            200..=299 => Outcome::Done(answer),
            300..=399 => Outcome::Fatal {
                why: format!(
                    "HTTP {status}: redirected to {}; set [embedding] url to where the service is",
                    location.as_deref().unwrap_or("(no Location)")
                ),
                trouble: None,
            },
            429 | 500..=599 => Outcome::Again {
                why: format!("HTTP {status}{}", said()),
                trouble: Trouble::Status(status),
                // Only these two statuses give Retry-After the meaning "retry after".
                retry_after: retry_after.filter(|_| status == 429 || status == 503),
            },
            _ => Outcome::Fatal { why: format!("HTTP {status}{}", said()), trouble: Some(Trouble::Status(status)) },
        }
    }
}

/// `why; advice`, or `why` alone.
fn join(why: &str, advice: Option<String>) -> String {
    match advice {
        Some(advice) if !advice.is_empty() => format!("{why}; {advice}"),
        _ => why.to_string(),
    }
}

/// A service's message on one line and at most 300 characters: an HTML error page must not
/// flood the terminal.
fn one_line(text: &str) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(300) {
        Some((cut, _)) => format!("{}…", &flat[..cut]),
        None => flat,
    }
}

/// A transport failure (no answer at all): always worth a retry.
fn transport(error: &reqwest::Error) -> Outcome {
    // reqwest says "error sending request for url (...)"; the cause is at the end of the chain.
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    let mut root = None;
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            root = Some(match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
                std::io::ErrorKind::ConnectionReset => "connection reset".to_string(),
                _ => io.to_string(),
            });
            break;
        }
        root = Some(e.to_string());
        cause = e.source();
    }
    let why = match root {
        Some(root) => format!("cannot reach the service ({root})"),
        None => format!("cannot reach the service ({error})"),
    };
    let trouble = if error.is_timeout() { Trouble::Timeout } else { Trouble::Unreachable };
    Outcome::Again { why, trouble, retry_after: None }
}

/// The whole body, refused past `cap` bytes.
async fn read_capped(mut response: reqwest::Response, cap: usize) -> Result<Vec<u8>, Outcome> {
    let too_big = || {
        Outcome::Fatal {
        why: format!(
            "the answer is larger than {} MiB, more than batch_size × dims numbers can take; is url an embedding service?",
            cap.div_ceil(1 << 20)
        ),
        trouble: None,
    }
    };
    if response.content_length().is_some_and(|n| n > cap as u64) {
        return Err(too_big());
    }
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) if body.len() + chunk.len() > cap => return Err(too_big()),
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => return Ok(body),
            // The connection dropped mid-answer: like no answer at all.
            Err(e) => return Err(transport(&e)),
        }
    }
}

/// `Retry-After` as a delay: whole or fractional seconds, or an HTTP date (a date in the past
/// means now). `None` when it is neither.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<f64>() {
        // `inf` and `NaN` parse as f64 too; Duration::from_secs_f64 would panic on them.
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(1e9)));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    Some(SystemTime::from(at).duration_since(now).unwrap_or(Duration::ZERO))
}

/// The wait before retry `n` (0-based): 250 ms × 2^n, capped at 10 s, with "equal jitter" (half
/// fixed, half random, `jitter` in [0, 1)) so clients that failed together do not retry together.
pub fn backoff(n: u32, jitter: f64) -> Duration {
    let full = FIRST_BACKOFF.saturating_mul(1u32 << n.min(16)).min(MAX_BACKOFF);
    full / 2 + full.mul_f64(jitter.clamp(0.0, 1.0) / 2.0)
}

/// A number in [0, 1) that differs between calls; std's hasher keys are random per instance,
/// which is all the randomness a backoff needs.
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64);
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Runs `future` to completion on ctx's runtime and returns its output.
fn run<T: Send + 'static>(future: impl Future<Output = T> + Send + 'static) -> Result<T, String> {
    crate::runtime::wait(future).ok_or_else(|| "the embedding request stopped before it answered".to_string())
}

/// The client all embedding requests share (its connection pool lives on ctx's runtime).
fn client() -> Result<&'static reqwest::Client, String> {
    // Static: one client whose policy is all constants, no config; the same client serves any application.
    static CLIENT: OnceLock<Result<reqwest::Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let _ = rustls::crypto::ring::default_provider().install_default();
            reqwest::Client::builder()
                .user_agent(concat!("ctx/", env!("CARGO_PKG_VERSION")))
                .pool_idle_timeout(Duration::from_secs(60))
                // A redirected POST may turn into a GET, or carry the key elsewhere: report it.
                .redirect(reqwest::redirect::Policy::none())
                // A proxy from the environment could see the key and the texts.
                .no_proxy()
                .build()
                .map_err(|e| format!("cannot build the HTTP client: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480); // 2015-10-21 07:28:00 UTC
        assert_eq!(parse_retry_after("2", now), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after(" 1.5 ", now), Some(Duration::from_millis(1500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("inf", now), None);
        assert_eq!(parse_retry_after("-3", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn backoff_doubles_is_capped_and_jittered() {
        assert_eq!(backoff(0, 0.0), Duration::from_millis(125));
        assert!(backoff(0, 0.999) > Duration::from_millis(249) && backoff(0, 0.999) < Duration::from_millis(250));
        assert_eq!(backoff(3, 0.0), Duration::from_millis(1000));
        assert_eq!(backoff(30, 0.5), Duration::from_millis(7500));
        let j = jitter();
        assert!((0.0..1.0).contains(&j));
    }

    #[test]
    fn service_messages_are_cut_to_one_line() {
        assert_eq!(one_line("a\n  b\tc"), "a b c");
        assert_eq!(one_line(&"x".repeat(500)).chars().count(), 301);
    }
}
