//! The console's login cookie against a real `ctx serve`: it opens the console's own files and
//! nothing else, and it is not the token (another server on the same host that receives it
//! learns nothing it could call ctx with).

use std::process::Command;

use crate::common::{ServeChild, Workspace, BIN};

const ADMIN: &str = "admin-token-0123456789abcdef";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn the_console_cookie_opens_only_the_consoles_files_and_is_not_the_token() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ws = Workspace::sample();
    let config = std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap();
    ws.write("ctx.toml", &config.replacen("[server]\n", &format!("[server]\nauth_token = \"{ADMIN}\"\n"), 1));
    let serve = ServeChild::spawn(Command::new(BIN).current_dir(ws.path()).env_remove("CTX_CONFIG").args([
        "serve",
        "--bind",
        "127.0.0.1:0",
    ]));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let url = |path: &str| format!("http://{}{path}", serve.addr);
    let send = |request: reqwest::RequestBuilder| {
        runtime.block_on(async {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            (status, headers, response.text().await.unwrap_or_default())
        })
    };

    // Logging in sets the cookie; its value is a MAC, not the token in any encoding.
    let (status, headers, _) = send(client.post(url("/console/login")).bearer_auth(ADMIN));
    assert_eq!(status, 204);
    let set = headers.get("set-cookie").unwrap().to_str().unwrap().to_string();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Path=/console"), "{set}");
    let cookie = set.split(';').next().unwrap().to_string();
    assert!(!cookie.contains(ADMIN) && !cookie.contains(&hex(ADMIN.as_bytes())), "{cookie}");
    // Behind a proxy that ends TLS, it is sent over HTTPS only.
    let (_, headers, _) =
        send(client.post(url("/console/login")).bearer_auth(ADMIN).header("x-forwarded-proto", "https"));
    assert!(headers.get("set-cookie").unwrap().to_str().unwrap().contains("; Secure"));

    // With it: the console's files. Without it: the login page only.
    let (status, _, page) = send(client.get(url("/console/")).header("cookie", &cookie));
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("<script type=\"module\""), "{page}");
    let (status, headers, _) = send(client.get(url("/console/")));
    assert_eq!(status, 303);
    assert_eq!(headers.get("location").unwrap(), "/console/login");
    for path in ["/console/style.css", "/console/app.js"] {
        assert_eq!(send(client.get(url(path))).0, 401, "{path} without the cookie");
        assert_eq!(send(client.get(url(path)).header("cookie", &cookie)).0, 200, "{path} with it");
    }
    let (status, headers, login) = send(client.get(url("/console/login")));
    assert_eq!(status, 200);
    let policy = headers.get("content-security-policy").unwrap().to_str().unwrap();
    assert!(policy.contains("script-src 'sha256-") && policy.contains("frame-ancestors 'none'"), "{policy}");
    assert!(login.contains("type=\"password\""));
    assert_eq!(send(client.head(url("/console/login"))).0, 200);

    // The cookie is no credential for any API route, and the token's hex is no cookie.
    for path in ["/tools/list", "/calls", "/sources/sync", "/chat"] {
        assert_eq!(send(client.get(url(path)).header("cookie", &cookie)).0, 401, "{path}");
    }
    let forged = format!("ctx_console={}", hex(ADMIN.as_bytes()));
    assert_eq!(send(client.get(url("/console/app.js")).header("cookie", forged)).0, 401);

    // A wrong method says which one to use.
    let (status, headers, body) = send(client.get(url("/console/logout")));
    assert_eq!(status, 405, "{body}");
    assert_eq!(headers.get("allow").unwrap(), "POST");
    assert!(body.contains("use POST"), "{body}");
}
