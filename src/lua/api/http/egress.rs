//! Where `http.*` may connect: the hosts of `allow_hosts`, and no private, loopback or
//! link-local address unless the operator allows it.
//!
//! Host names are checked as written in each URL (the first request and every redirect hop);
//! addresses are checked after DNS, by the client's resolver ([`Resolver`]), so a public name
//! that points inside is caught. IP literals in a URL never reach a resolver and are checked
//! here, before the request. A private address is allowed when the section sets
//! `allow_private = true`, when an exact `allow_hosts` entry names the host (the operator who
//! wrote `allow_hosts = ["localhost"]` means localhost), or when it lies in an `allow_hosts`
//! CIDR range.
//!
//! Each distinct policy gets its own client: a pooled connection opened under a lenient policy
//! must never serve a script with a strict one.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;

use crate::config::hosts::HostRule;
use crate::lua::ScriptInfo;

/// One script section's egress rules.
#[derive(Debug, PartialEq, Eq, Hash, Clone)]
pub struct Policy {
    /// `allow_hosts` as written (for messages), `None` when any host may be reached.
    allow_hosts: Option<Vec<String>>,
    allow_private: bool,
}

/// Why a destination was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The host is not in `allow_hosts`.
    NotListed { host: String, allowed: Vec<String> },
    /// The host is, or resolves to, an address inside (`what` reads "loopback", "private", ...).
    Internal { host: String, addr: IpAddr, what: &'static str },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotListed { host, allowed } => {
                write!(f, "host {host:?} is not in this script's allow_hosts ({})", allowed.join(", "))
            }
            Refusal::Internal { host, addr, what } if literal(host) == Some(*addr) => {
                write!(f, "{addr} is {} {what} address", article(what))
            }
            Refusal::Internal { host, addr, what } => {
                write!(f, "host {host:?} resolves to {addr}, {} {what} address", article(what))
            }
        }
    }
}

impl std::error::Error for Refusal {}

impl Refusal {
    /// The whole message: what was refused, and which setting of which section allows it.
    pub fn explain(&self, info: &ScriptInfo) -> String {
        let section = format!("[{}.{}]", info.kind.section(), info.name);
        match self {
            Refusal::NotListed { host, .. } => format!("{self}; add {host:?} to allow_hosts in {section} of ctx.toml"),
            Refusal::Internal { host, addr, .. } => {
                let entry = if literal(host) == Some(*addr) {
                    format!("\"{addr}\" (or a CIDR range around it)")
                } else {
                    format!("{host:?}")
                };
                format!(
                    "{self}, and ctx refuses private, loopback and link-local addresses unless the operator allows them: \
                     add {entry} to allow_hosts, or set allow_private = true, in {section} of ctx.toml"
                )
            }
        }
    }
}

impl Policy {
    pub fn of(info: &ScriptInfo) -> Policy {
        Policy { allow_hosts: info.allow_hosts.clone(), allow_private: info.allow_private }
    }

    fn rules(&self) -> Vec<HostRule> {
        // A malformed entry is a config error reported at load; here it simply matches nothing.
        self.allow_hosts.iter().flatten().filter_map(|entry| HostRule::parse(entry).ok()).collect()
    }

    /// Checks a URL before it is requested: its host against `allow_hosts`, and an IP literal
    /// against the private ranges (names are checked after DNS, by [`Resolver`]).
    pub fn check_url(&self, url: &Url) -> Result<(), Refusal> {
        let host = url.host_str().unwrap_or_default().to_string();
        if let Some(allowed) = &self.allow_hosts {
            if !self.rules().iter().any(|rule| rule.matches_host(&host)) {
                return Err(Refusal::NotListed { host, allowed: allowed.clone() });
            }
        }
        match literal(&host) {
            Some(addr) => self.check_addr(&host, addr),
            None => Ok(()),
        }
    }

    /// Checks one address `host` resolved to (or is).
    pub fn check_addr(&self, host: &str, addr: IpAddr) -> Result<(), Refusal> {
        let Some(what) = internal(addr) else { return Ok(()) };
        if self.allow_private {
            return Ok(());
        }
        let rules = self.rules();
        if rules.iter().any(|rule| rule.names(host) || rule.contains(addr)) {
            return Ok(());
        }
        Err(Refusal::Internal { host: host.to_string(), addr, what })
    }
}

fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// The address a URL host is, when it is an IP literal (`10.0.0.1`, `[::1]`). The URL parser
/// has already turned forms like `127.1` or `0x7f000001` into dotted quads.
fn literal(host: &str) -> Option<IpAddr> {
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host).parse().ok()
}

/// What kind of inside address `addr` is, or `None` for a public one.
///
/// IPv4: 0/8 ("this network", 0.0.0.0), 10/8, 172.16/12, 192.168/16, 127/8, 169.254/16,
/// 100.64/10 (carrier-grade NAT), 224/4 (multicast) and 240/4 (reserved, broadcast).
/// IPv6: ::, ::1, fc00::/7, fe80::/10, fec0::/10, ff00::/8, and the IPv4 addresses that
/// IPv4-mapped (::ffff:0:0/96), IPv4-compatible (::/96), NAT64 (64:ff9b::/96) and 6to4
/// (2002::/16) addresses carry.
pub fn internal(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => internal_v6(v6),
    }
}

fn internal_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    match (a, b) {
        (0, _) => Some("unspecified"),
        (127, _) => Some("loopback"),
        (10, _) | (192, 168) => Some("private"),
        (172, b) if (16..32).contains(&b) => Some("private"),
        (169, 254) => Some("link-local"),
        (100, b) if (64..128).contains(&b) => Some("carrier-grade NAT"),
        (224..=239, _) => Some("multicast"),
        (240..=255, _) => Some("reserved"),
        _ => None,
    }
}

fn internal_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let seg = ip.segments();
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    if let Some(v4) = ip.to_ipv4_mapped() {
        return internal_v4(v4);
    }
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    match seg[0] {
        0 if seg[1..6].iter().all(|s| *s == 0) => internal_v4(embedded(seg[6], seg[7])),
        0x64 if seg[1] == 0xff9b && seg[2..6].iter().all(|s| *s == 0) => internal_v4(embedded(seg[6], seg[7])),
        0x2002 => internal_v4(embedded(seg[1], seg[2])),
        s if s & 0xfe00 == 0xfc00 => Some("private"),
        s if s & 0xffc0 == 0xfe80 => Some("link-local"),
        s if s & 0xffc0 == 0xfec0 => Some("private"),
        s if s & 0xff00 == 0xff00 => Some("multicast"),
        _ => None,
    }
}

/// Resolves with the system resolver, then keeps only the addresses the policy allows.
struct Resolver {
    policy: Policy,
}

impl Resolve for Resolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match policy.check_addr(&host, a.ip()) {
                    Ok(()) => true,
                    Err(why) => {
                        refused.get_or_insert(why);
                        false
                    }
                })
                .collect();
            match refused {
                Some(why) if allowed.is_empty() => Err(Box::new(why) as Box<dyn std::error::Error + Send + Sync>),
                _ => Ok(Box::new(allowed.into_iter()) as Addrs),
            }
        })
    }
}

/// The most clients kept; past it the cache starts over (configs rarely have that many
/// distinct policies, and a reload can retire old ones).
const MAX_CLIENTS: usize = 64;

/// The pooled client for `policy` (rustls with the ring provider), built on first use.
///
/// Redirects are never followed by the client: `http` follows them itself, hop by hop, so that
/// each one is checked and the script's headers stay with the host they were meant for.
/// Proxies from the environment are ignored: through a proxy, ctx could not see where a
/// request really goes.
pub fn client(policy: &Policy) -> reqwest::Client {
    // Static: clients keyed by their whole policy: the same policy gives the same client in any application.
    static CLIENTS: OnceLock<Mutex<HashMap<Policy, reqwest::Client>>> = OnceLock::new();
    let mut clients = CLIENTS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(client) = clients.get(policy) {
        return client.clone();
    }
    if clients.len() >= MAX_CLIENTS {
        clients.clear();
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .user_agent(concat!("ctx/", env!("CARGO_PKG_VERSION")))
        .pool_idle_timeout(Duration::from_secs(60))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Resolver { policy: policy.clone() })
        .build()
        .expect("the HTTP client builds");
    clients.insert(policy.clone(), client.clone());
    client
}

/// The egress refusal somewhere in `err`'s chain of causes, if that is why a request failed.
pub fn refusal_in<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refusal> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(refusal) = e.downcast_ref::<Refusal>() {
            return Some(refusal);
        }
        source = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn inside_addresses_are_classified() {
        for (addr, what) in [
            ("127.0.0.1", "loopback"),
            ("10.1.2.3", "private"),
            ("172.31.0.1", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("0.0.0.0", "unspecified"),
            ("255.255.255.255", "reserved"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fd00::1", "private"),
            ("fe80::1", "link-local"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("::127.0.0.1", "loopback"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("2002:c0a8:0101::1", "private"),
        ] {
            assert_eq!(internal(ip(addr)), Some(what), "{addr}");
        }
        for public in ["8.8.8.8", "172.32.0.1", "100.128.0.1", "2001:4860:4860::8888", "::ffff:8.8.8.8"] {
            assert_eq!(internal(ip(public)), None, "{public}");
        }
    }

    fn policy(hosts: Option<&[&str]>, allow_private: bool) -> Policy {
        Policy { allow_hosts: hosts.map(|h| h.iter().map(|s| s.to_string()).collect()), allow_private }
    }

    #[test]
    fn private_addresses_need_the_operator() {
        let strict = policy(None, false);
        assert!(strict.check_addr("example.com", ip("93.184.216.34")).is_ok());
        let refused = strict.check_addr("intranet.example.com", ip("10.0.0.5")).unwrap_err();
        assert_eq!(refused.to_string(), "host \"intranet.example.com\" resolves to 10.0.0.5, a private address");
        assert!(policy(None, true).check_addr("x", ip("10.0.0.5")).is_ok());
        let named = policy(Some(&["localhost", "*.corp.example", "10.0.0.0/8"]), false);
        assert!(named.check_addr("localhost", ip("127.0.0.1")).is_ok());
        assert!(named.check_addr("a.corp.example", ip("192.168.0.1")).is_err(), "a wildcard names no host");
        assert!(named.check_addr("a.corp.example", ip("10.3.3.3")).is_ok(), "inside an allowed range");
        let url = |s: &str| Url::parse(s).unwrap();
        assert!(matches!(named.check_url(&url("http://127.0.0.1/")), Err(Refusal::NotListed { .. })));
        assert!(named.check_url(&url("http://10.1.1.1/")).is_ok());
        let literal = strict.check_url(&url("http://[::ffff:7f00:1]/")).unwrap_err();
        assert_eq!(literal.to_string(), "::ffff:127.0.0.1 is a loopback address");
    }
}
