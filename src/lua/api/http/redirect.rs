//! One `http.*` request, redirects followed by hand: every hop is checked against the egress
//! policy before it is requested, and the headers the script set never follow a redirect to
//! another origin (an `X-Api-Key` is meant for the host the script named, as browsers and curl
//! treat `Authorization`).

use axum::body::Bytes;
use reqwest::{Client, Method, Url};

use super::egress::{self, Policy, Refusal};

/// The most redirects one request follows (reqwest's and curl's default is near this).
pub const MAX_REDIRECTS: usize = 10;

/// A request as the script asked for it.
pub struct Outgoing {
    pub method: Method,
    pub url: Url,
    /// The script's own headers.
    pub headers: Vec<(String, String)>,
    pub body: Option<Payload>,
}

/// A request body; `Bytes` so a 307/308 can send it again without a copy.
pub struct Payload {
    pub bytes: Bytes,
    /// Sent with `content-type: application/json` unless the script set one.
    pub json: bool,
}

/// Status, headers (lower-case names) and body of the last response.
pub type Fetched = (u16, Vec<(String, String)>, Vec<u8>);

/// Why a request got no answer.
pub enum Failure {
    Http(reqwest::Error),
    /// The egress policy refused a destination; `from` is the host that redirected there.
    Refused {
        from: Option<String>,
        refusal: Refusal,
    },
    TooManyRedirects,
    /// A redirect with a Location that is not an http(s) URL.
    BadLocation {
        from: String,
        reason: String,
    },
    /// The request's timeout passed (set by the caller around [`fetch`]).
    TimedOut,
}

/// Sends `request`, following redirects. `Ok(Err(size))` when the body outgrew `max_body`.
pub async fn fetch(
    client: &Client,
    policy: &Policy,
    mut request: Outgoing,
    max_body: usize,
) -> Result<Result<Fetched, usize>, Failure> {
    // Once the request leaves the script's origin, its headers stay behind for good: a hop back
    // does not make the next host any more trusted.
    let mut own_headers = true;
    let mut came_from: Option<String> = None;
    for hop in 0..=MAX_REDIRECTS {
        let mut builder = client.request(request.method.clone(), request.url.clone());
        let mut has_content_type = false;
        for (k, v) in &request.headers {
            let content_type = k.eq_ignore_ascii_case("content-type");
            // The body's type goes along with the body; nothing else the script set crosses origins.
            let keep = if content_type { request.body.is_some() || hop == 0 } else { own_headers };
            if keep {
                has_content_type |= content_type;
                builder = builder.header(k.as_str(), v.as_str());
            }
        }
        if let Some(body) = &request.body {
            if body.json && !has_content_type {
                builder = builder.header("content-type", "application/json");
            }
            builder = builder.body(body.bytes.clone());
        }
        let mut response = match builder.send().await {
            Ok(response) => response,
            Err(e) => {
                return Err(match egress::refusal_in(&e) {
                    Some(refusal) => Failure::Refused { from: came_from, refusal: refusal.clone() },
                    None => Failure::Http(e),
                })
            }
        };
        let status = response.status().as_u16();
        let location = response.headers().get(reqwest::header::LOCATION).cloned();
        if let (301 | 302 | 303 | 307 | 308, Some(location)) = (status, location) {
            let from = request.url.host_str().unwrap_or_default().to_string();
            if hop == MAX_REDIRECTS {
                return Err(Failure::TooManyRedirects);
            }
            let next = location.to_str().ok().and_then(|l| request.url.join(l).ok()).ok_or_else(|| {
                Failure::BadLocation { from: from.clone(), reason: "its Location is not a URL".into() }
            })?;
            if !matches!(next.scheme(), "http" | "https") {
                let reason = format!("it leads to a {}: URL; only http and https are followed", next.scheme());
                return Err(Failure::BadLocation { from, reason });
            }
            policy.check_url(&next).map_err(|refusal| Failure::Refused { from: Some(from.clone()), refusal })?;
            if origin(&next) != origin(&request.url) {
                own_headers = false;
            }
            // As browsers (and reqwest) do: 301/302/303 become a GET without a body, 307/308
            // repeat the request as it was.
            if matches!(status, 301..=303) {
                request.body = None;
                if request.method != Method::HEAD {
                    request.method = Method::GET;
                }
            }
            request.url = next;
            came_from = Some(from);
            continue;
        }
        let headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_ascii_lowercase(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(Failure::Http)? {
            body.extend_from_slice(&chunk);
            if body.len() > max_body {
                return Ok(Err(body.len()));
            }
        }
        return Ok(Ok((status, headers, body)));
    }
    Err(Failure::TooManyRedirects)
}

/// Scheme, host and port: what "the same site" means for the script's headers.
fn origin(url: &Url) -> (String, String, Option<u16>) {
    (url.scheme().to_string(), url.host_str().unwrap_or_default().to_ascii_lowercase(), url.port_or_known_default())
}
