//! What an `allow_hosts` entry means: a host name, a `*.suffix`, an IP address or a CIDR range.

use std::net::IpAddr;

/// One `allow_hosts` entry, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostRule {
    /// An exact host name, lower case, without a trailing dot.
    Name(String),
    /// `*.example.com`: any name under `example.com` (not `example.com` itself).
    Suffix(String),
    /// One IP address (`127.0.0.1`, `::1` or `[::1]`).
    Addr(IpAddr),
    /// A CIDR range (`10.0.0.0/8`, `fd00::/8`).
    Net { base: IpAddr, prefix: u8 },
}

impl HostRule {
    /// Parses an entry; only a malformed CIDR range is an error (anything else is a name).
    pub fn parse(entry: &str) -> Result<HostRule, String> {
        let entry = entry.trim().to_ascii_lowercase();
        if let Some((base, prefix)) = entry.split_once('/') {
            let base: IpAddr = unbracket(base)
                .parse()
                .map_err(|_| format!("{entry:?} is not a CIDR range: {base:?} is not an IP address"))?;
            let max = if base.is_ipv4() { 32 } else { 128 };
            let prefix: u8 = prefix
                .parse()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{entry:?} is not a CIDR range: the prefix length must be 0 to {max}"))?;
            return Ok(HostRule::Net { base, prefix });
        }
        if let Ok(addr) = unbracket(&entry).parse::<IpAddr>() {
            return Ok(HostRule::Addr(addr));
        }
        Ok(match entry.strip_prefix("*.") {
            Some(suffix) => HostRule::Suffix(suffix.trim_end_matches('.').to_string()),
            None => HostRule::Name(entry.trim_end_matches('.').to_string()),
        })
    }

    /// True when the URL host `host` (a name or an IP literal) is allowed by this entry.
    pub fn matches_host(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        let host = host.trim_end_matches('.');
        match self {
            HostRule::Name(name) => host == name,
            HostRule::Suffix(suffix) => host.strip_suffix(suffix.as_str()).is_some_and(|rest| rest.ends_with('.')),
            HostRule::Addr(addr) => unbracket(host).parse::<IpAddr>().is_ok_and(|ip| same(ip, *addr)),
            HostRule::Net { .. } => unbracket(host).parse::<IpAddr>().is_ok_and(|ip| self.contains(ip)),
        }
    }

    /// True when this entry names `host` itself, so the operator means it, private or not: an
    /// exact name or address. A `*.suffix` does not: anyone who controls one name under it
    /// could point it inside.
    pub fn names(&self, host: &str) -> bool {
        matches!(self, HostRule::Name(_) | HostRule::Addr(_)) && self.matches_host(host)
    }

    /// True when `ip` is this entry's address or inside its range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match *self {
            HostRule::Addr(addr) => same(ip, addr),
            HostRule::Net { base, prefix } => match (canonical(ip), canonical(base)) {
                (IpAddr::V4(ip), IpAddr::V4(base)) => {
                    masked(u32::from(ip).into(), prefix, 32) == masked(u32::from(base).into(), prefix, 32)
                }
                (IpAddr::V6(ip), IpAddr::V6(base)) => {
                    masked(u128::from(ip), prefix, 128) == masked(u128::from(base), prefix, 128)
                }
                _ => false,
            },
            _ => false,
        }
    }
}

fn masked(bits: u128, prefix: u8, width: u8) -> u128 {
    let keep = u32::from(prefix.min(width));
    if keep == 0 {
        0
    } else {
        bits >> (u32::from(width) - keep)
    }
}

fn same(a: IpAddr, b: IpAddr) -> bool {
    canonical(a) == canonical(b)
}

/// `::ffff:a.b.c.d` is the IPv4 address it maps.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

fn unbracket(host: &str) -> &str {
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> HostRule {
        HostRule::parse(s).unwrap()
    }

    #[test]
    fn names_suffixes_addresses_and_ranges() {
        assert!(rule("API.example.com").matches_host("api.example.com."));
        assert!(rule("*.corp.example").matches_host("a.b.corp.example"));
        assert!(!rule("*.corp.example").matches_host("corp.example"));
        assert!(!rule("*.corp.example").matches_host("evilcorp.example"));
        assert!(rule("[::1]").matches_host("[::1]") && rule("::1").matches_host("[::1]"));
        assert!(rule("10.0.0.0/8").matches_host("10.2.3.4") && !rule("10.0.0.0/8").matches_host("11.0.0.1"));
        assert!(rule("10.0.0.0/8").contains("::ffff:10.9.9.9".parse().unwrap()));
        assert!(rule("fd00::/8").contains("fd12::1".parse().unwrap()));
        assert!(rule("0.0.0.0/0").contains("8.8.8.8".parse().unwrap()));
        assert!(rule("localhost").names("localhost") && !rule("*.example.com").names("a.example.com"));
        assert!(HostRule::parse("10.0.0.0/33").unwrap_err().contains("0 to 32"));
        assert!(HostRule::parse("nope/8").unwrap_err().contains("not an IP address"));
    }
}
