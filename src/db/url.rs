//! `[db] url`: a `postgres://` URL read into the driver's settings, with the TLS options the
//! driver does not know (`sslmode=verify-ca|verify-full`, `sslrootcert`) taken out first, and a
//! form of it that is safe to print.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// How the connection is encrypted and what is checked, as libpq's `sslmode` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, else plain; the certificate is not checked (libpq's
    /// default, `prefer`; `allow` reads the same).
    Prefer,
    /// TLS or no connection; the certificate is checked against `sslrootcert` when one is given
    /// (as libpq does), else not.
    Require,
    /// TLS, the certificate chain checked (against `sslrootcert`, else the system's roots), not
    /// the host name.
    VerifyCa,
    /// TLS, the chain and the host name checked.
    VerifyFull,
}

impl SslMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// A parsed `[db] url`.
#[derive(Clone)]
pub struct DbUrl {
    /// What the driver connects with (the password included).
    pub config: tokio_postgres::Config,
    pub ssl_mode: SslMode,
    pub ssl_root_cert: Option<PathBuf>,
    /// The URL with its password replaced, for logs, errors and `/health`.
    shown: String,
}

impl fmt::Debug for DbUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Display for DbUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl DbUrl {
    /// Reads `url`. `password` fills in one the URL does not carry (libpq's `PGPASSWORD`), so a
    /// config can name the database without holding the secret.
    pub fn parse(url: &str, password: Option<&str>) -> Result<DbUrl, String> {
        let url = url.trim();
        let Some(rest) = url.strip_prefix("postgres://").or_else(|| url.strip_prefix("postgresql://")) else {
            return Err(format!(
                "expected a postgres:// URL such as postgres://ctx@db.internal:5432/ctx, got '{}'",
                redact(url)
            ));
        };
        // The driver takes everything before the first '@' as the user and password: a '/', '?'
        // or '#' there, or a second '@', would make ctx and the driver read the URL differently
        // (and the password could show where ctx hides a user name).
        if let Some((userinfo, after)) = rest.split_once('@') {
            if userinfo.contains(['/', '?', '#']) || after.contains('@') {
                return Err(format!(
                    "'{}': the user or password holds a character a URL reserves; write it percent-encoded (/ as %2F, ? as %3F, # as %23, @ as %40)",
                    redact(url)
                ));
            }
        }
        let (main, query) = match rest.split_once('?') {
            Some((main, query)) => (main, Some(query)),
            None => (rest, None),
        };
        // The query options the driver rejects or ignores, taken out; the rest passed on.
        let mut ssl_mode = SslMode::Prefer;
        let mut ssl_root_cert = None;
        let mut kept = Vec::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if key.contains('%') {
                return Err(format!("'{}': write option names plainly, not percent-encoded", redact(url)));
            }
            match key {
                "sslmode" => {
                    ssl_mode = match value {
                        "disable" => SslMode::Disable,
                        "allow" | "prefer" => SslMode::Prefer,
                        "require" => SslMode::Require,
                        "verify-ca" => SslMode::VerifyCa,
                        "verify-full" => SslMode::VerifyFull,
                        other => {
                            return Err(format!(
                            "sslmode '{other}' is not one of disable, allow, prefer, require, verify-ca, verify-full"
                        ))
                        }
                    }
                }
                "sslrootcert" => ssl_root_cert = Some(PathBuf::from(percent_decode(value)?)),
                "sslcert" | "sslkey" | "sslpassword" | "sslcrl" => {
                    return Err(format!(
                        "{key} is not supported: ctx connects with a password (scram-sha-256), not a client certificate"
                    ))
                }
                _ => kept.push(pair),
            }
        }
        let driver_url = match kept.is_empty() {
            true => format!("postgres://{main}"),
            false => format!("postgres://{main}?{}", kept.join("&")),
        };
        let mut config = tokio_postgres::Config::from_str(&driver_url)
            .map_err(|e| format!("'{}' is not a valid PostgreSQL URL: {e}", redact(url)))?;
        if config.get_hosts().is_empty() {
            return Err(format!("'{}' names no host; write postgres://user@host:5432/database", redact(url)));
        }
        if config.get_user().is_none() {
            return Err(format!("'{}' names no user; write postgres://user@host:5432/database", redact(url)));
        }
        if config.get_dbname().is_none() {
            return Err(format!("'{}' names no database; write postgres://user@host:5432/database", redact(url)));
        }
        if config.get_password().is_none() {
            if let Some(password) = password.filter(|p| !p.is_empty()) {
                config.password(password);
            }
        }
        // The driver's own mode: verification is ctx's TLS connector's job (db::tls).
        config.ssl_mode(match ssl_mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        if config.get_application_name().is_none() {
            config.application_name("ctx");
        }
        Ok(DbUrl { config, ssl_mode, ssl_root_cert, shown: redact(url) })
    }

    /// The password in the URL or given beside it: a secret every log must hide.
    pub fn password(&self) -> Option<String> {
        self.config.get_password().map(|p| String::from_utf8_lossy(p).into_owned())
    }

    pub fn user(&self) -> &str {
        self.config.get_user().unwrap_or("")
    }

    pub fn dbname(&self) -> &str {
        self.config.get_dbname().unwrap_or("")
    }

    /// `host:port`, for messages.
    pub fn address(&self) -> String {
        let host = match self.config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            #[cfg(unix)]
            Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
            None => String::new(),
        };
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        format!("{host}:{port}")
    }
}

/// `url` with the password of its user part and any `password=` option replaced by `***`. For a
/// URL too odd to parse, everything between the user name and the last '@' is hidden: whatever
/// a driver might take for the password never shows.
pub fn redact(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => (&url[..i + 3], &url[i + 3..]),
        None => ("", url),
    };
    let (userinfo, after) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at..]),
        None => (None, rest),
    };
    let user = userinfo.map(|u| match u.split_once(':') {
        Some((user, _)) => format!("{}:***", user.split(['/', '?', '#']).next().unwrap_or("")),
        None if u.contains(['/', '?', '#']) => "***".to_string(),
        None => u.to_string(),
    });
    let (main, query) = match after.split_once('?') {
        Some((m, q)) => (m, Some(q)),
        None => (after, None),
    };
    let query = query.map(|q| {
        q.split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if key.eq_ignore_ascii_case("password") || key.contains('%') => format!("{key}=***"),
                _ => pair.to_string(),
            })
            .collect::<Vec<_>>()
            .join("&")
    });
    let mut shown = format!("{scheme}{}{main}", user.unwrap_or_default());
    if let Some(q) = query {
        shown.push('?');
        shown.push_str(&q);
    }
    shown
}

fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3).ok_or_else(|| format!("'{text}' has a cut-off %-escape"))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("'{text}' has a bad %-escape '%{hex}'"))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("'{text}' is not UTF-8 once decoded"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("postgres://ctx:s3cret@db:5432/ctx"), "postgres://ctx:***@db:5432/ctx");
        assert_eq!(redact("postgres://ctx:p@ss@db/ctx?sslmode=require"), "postgres://ctx:***@db/ctx?sslmode=require");
        assert_eq!(redact("postgres://db/ctx?user=a&password=x"), "postgres://db/ctx?user=a&password=***");
        assert_eq!(redact("postgres://ctx@db/ctx"), "postgres://ctx@db/ctx");
        assert_eq!(redact("postgres://db/ctx"), "postgres://db/ctx");
        // A password with URL characters, read as the driver would read it, never shows.
        assert_eq!(redact("postgres://ctx:ab/cd@db/ctx"), "postgres://ctx:***@db/ctx");
        assert_eq!(redact("postgres://ctx:ab?c@d@db/ctx?sslmode=require"), "postgres://ctx:***@db/ctx?sslmode=require");
        assert_eq!(redact("postgres://db/ctx?pass%77ord=x"), "postgres://db/ctx?pass%77ord=***");
        for odd in
            ["postgres://ctx:ab/cd@db/ctx", "postgres://ctx:a?sslmode=disable@db/ctx", "postgres://ctx:a@b@db/ctx"]
        {
            let error = DbUrl::parse(odd, None).err().unwrap_or_else(|| panic!("{odd} parsed"));
            assert!(error.contains("percent-encoded"), "{error}");
            assert!(!error.contains("ab/cd") && !error.contains(":a?") && !error.contains(":a@b"), "{error}");
        }
        // Percent-encoded, the same password works and stays hidden.
        let url = DbUrl::parse("postgres://ctx:ab%2Fcd@db/ctx?sslmode=require", None).unwrap();
        assert_eq!(url.password().as_deref(), Some("ab/cd"));
        assert_eq!(url.ssl_mode, SslMode::Require);
        assert!(!url.to_string().contains("ab"), "{url}");
        let url = DbUrl::parse("postgres://ctx:s3cret@db:5432/ctx", None).unwrap();
        assert!(!format!("{url} {url:?}").contains("s3cret"));
        assert_eq!(url.password().as_deref(), Some("s3cret"));
    }

    #[test]
    fn tls_options_are_read_by_ctx_and_the_rest_by_the_driver() {
        let url = DbUrl::parse(
            "postgresql://ctx@db/ctx?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=3",
            None,
        )
        .unwrap();
        assert_eq!(url.ssl_mode, SslMode::VerifyFull);
        assert_eq!(url.ssl_root_cert, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(url.config.get_connect_timeout(), Some(&std::time::Duration::from_secs(3)));
        assert_eq!(url.address(), "db:5432");
        assert_eq!(DbUrl::parse("postgres://ctx@db/ctx", None).unwrap().ssl_mode, SslMode::Prefer);
    }

    #[test]
    fn a_password_beside_the_url_fills_in_only_a_missing_one() {
        let url = DbUrl::parse("postgres://ctx@db/ctx", Some("fromenv")).unwrap();
        assert_eq!(url.password().as_deref(), Some("fromenv"));
        let url = DbUrl::parse("postgres://ctx:inurl@db/ctx", Some("fromenv")).unwrap();
        assert_eq!(url.password().as_deref(), Some("inurl"));
    }

    #[test]
    fn a_wrong_url_says_what_to_write() {
        for (url, said) in [
            ("mysql://ctx@db/ctx", "expected a postgres:// URL"),
            ("postgres://ctx@db/ctx?sslmode=strict", "sslmode 'strict'"),
            ("postgres://ctx@db/ctx?sslcert=a.pem", "client certificate"),
            ("postgres://db/ctx", "names no user"),
            ("postgres://ctx@db", "names no database"),
            ("postgres://ctx:pw@db:notaport/ctx", "not a valid PostgreSQL URL"),
        ] {
            let error = DbUrl::parse(url, None).err().unwrap_or_else(|| panic!("{url} parsed"));
            assert!(error.contains(said), "{url}: {error}");
            assert!(!error.contains(":pw@"), "{error}");
        }
    }
}
