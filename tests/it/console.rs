//! The browser console (`/console`): its files are served only with the token, and each area
//! works end to end in a real Chromium against a real `ctx serve` (tests/console/console_test.py,
//! driven by Playwright; the only stand-in is the chat model, tests/console/openai_stub.py).
//!
//! The browser scenarios need `scripts/test-env` (Playwright in its venv, Debian's Chromium as
//! CTX_TEST_CHROMIUM); without it they are skipped, and in CI they fail.

use std::process::Command;
use std::sync::Mutex;

use crate::common::{repo, run_ok, test_python, BIN};
use crate::scoped_tokens_and_rates::{serve, ADMIN, CI};

/// One Chromium at a time: on two cores, parallel browsers make each other's timings flaky.
static BROWSER: Mutex<()> = Mutex::new(());

/// Runs one scenario of tests/console/console_test.py with the binary under test, and returns
/// its output (its "ok: …" lines, timings); `None` when the browser tests are not set up here.
fn scenario(name: &str) -> Option<String> {
    let python = test_python()?;
    let chromium = match std::env::var_os("CTX_TEST_CHROMIUM") {
        Some(path) => path,
        None if std::env::var_os("CI").is_some() => {
            panic!("CTX_TEST_CHROMIUM is not set; CI must run the suite after eval \"$(scripts/test-env)\"")
        }
        None => {
            eprintln!("skipping a browser test: eval \"$(scripts/test-env)\" enables it");
            return None;
        }
    };
    let _one = BROWSER.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let out = run_ok(
        Command::new(python)
            .arg(repo().join("tests/console/console_test.py"))
            .arg(name)
            .env("CTX_BIN", BIN)
            .env("CTX_TEST_CHROMIUM", chromium)
            // The embedded files are the ones under test, not a folder on disk.
            .env_remove("CTX_CONSOLE_DIR"),
    );
    eprintln!("{out}");
    assert!(out.contains(&format!("scenario {name}:")), "the scenario did not finish:\n{out}");
    Some(out)
}

#[test]
fn console_files_are_served_only_with_the_token_except_the_login_page() {
    let s = serve("");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    // (status, Location, Content-Type, Set-Cookie, Content-Security-Policy) of one request.
    let fetch = |method: &str, path: &str, headers: &[(&str, String)]| {
        runtime.block_on(async {
            let mut request = client.request(method.parse().unwrap(), s.url(path));
            for (k, v) in headers {
                request = request.header(*k, v);
            }
            let response = request.send().await.unwrap();
            let header =
                |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
            let seen =
                (header("location"), header("content-type"), header("set-cookie"), header("content-security-policy"));
            (response.status().as_u16(), seen)
        })
    };

    // The cookie a login sets (a MAC of the token, made by the server): the only way to get one.
    let cookie = |token: &str| {
        let (status, (_, _, set_cookie, _)) =
            fetch("POST", "/console/login", &[("authorization", format!("Bearer {token}"))]);
        assert_eq!(status, 204, "login with {token}");
        set_cookie.split(';').next().unwrap().to_string()
    };
    let (admin, scoped) = (cookie(ADMIN), cookie(CI));
    let wrong = format!("ctx_console={}", "ab".repeat(32));

    // Every file of console/, and the page itself, without a token: 401, or for the page a
    // redirect to the login page; a wrong cookie opens nothing either.
    let mut files: Vec<String> = std::fs::read_dir(repo().join("console"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    for name in &files {
        let path = format!("/console/{name}");
        // The page itself sends a browser to the login page; every other file is a plain 401.
        let closed = if name == "index.html" { (303, "/console/login".to_string()) } else { (401, String::new()) };
        let (status, (location, ..)) = fetch("GET", &path, &[]);
        assert_eq!((status, location), closed, "{path} without a token");
        let (status, (location, ..)) = fetch("GET", &path, &[("cookie", wrong.clone())]);
        assert_eq!((status, location), closed, "{path} with a wrong cookie");
        let (status, (_, kind, _, csp)) = fetch("GET", &path, &[("cookie", admin.clone())]);
        assert_eq!(status, 200, "{path} with the cookie");
        assert!(!kind.is_empty() && csp.contains("script-src 'self'"), "{path}: {kind} / {csp}");
        assert_eq!(
            fetch("GET", &path, &[("authorization", format!("Bearer {ADMIN}"))]).0,
            200,
            "{path} with the bearer token"
        );
        // A scoped token opens the console too (it shows that token's tools only).
        assert_eq!(fetch("GET", &path, &[("cookie", scoped.clone())]).0, 200, "{path} with a scoped token's cookie");
    }
    let (status, (location, ..)) = fetch("GET", "/console/", &[]);
    assert_eq!((status, location.as_str()), (303, "/console/login"));
    let (status, (location, ..)) = fetch("GET", "/console", &[]);
    assert_eq!((status, location.as_str()), (303, "/console/"));
    let (status, (_, kind, ..)) = fetch("GET", "/console/", &[("cookie", admin.clone())]);
    assert_eq!((status, kind.as_str()), (200, "text/html; charset=utf-8"));
    // A name that is not one of the files is no way around it.
    assert_eq!(fetch("GET", "/console/nothing-here.js", &[]).0, 401);
    assert_eq!(fetch("GET", "/console/nothing-here.js", &[("cookie", admin.clone())]).0, 404);

    // The login page is the one page open to all; a wrong token gets no cookie.
    let (status, (_, kind, ..)) = fetch("GET", "/console/login", &[]);
    assert_eq!((status, kind.as_str()), (200, "text/html; charset=utf-8"));
    let (status, (_, _, set_cookie, _)) =
        fetch("POST", "/console/login", &[("authorization", "Bearer wrong-token-0123456789".into())]);
    assert_eq!((status, set_cookie.as_str()), (401, ""));
    // The cookie is for the console's files: it opens no API route.
    assert_eq!(fetch("GET", "/tools/list", &[("cookie", admin)]).0, 401);
}
#[test]
fn browser_search_filters_results_opens_a_whole_document_and_logout_closes_the_console() {
    scenario("search");
}

#[test]
fn browser_tool_form_follows_the_json_schema_renders_results_and_shows_validation_errors_at_their_fields() {
    scenario("tools");
}

#[test]
fn browser_a_call_waiting_for_approval_runs_once_approved_in_the_console_and_a_denied_one_is_refused() {
    scenario("approvals");
}

#[test]
fn browser_activity_shows_new_calls_live_a_failing_upstream_and_metric_charts() {
    scenario("activity");
}

#[test]
fn browser_a_scoped_token_sees_only_its_tools_and_no_approvals_metrics_or_upstreams() {
    scenario("scoped");
}

#[test]
fn browser_a_sync_started_in_the_console_finishes_with_the_new_counts() {
    scenario("sync");
}

#[test]
fn browser_chat_runs_the_models_tool_calls_pausing_for_approval_and_sends_the_results_back() {
    scenario("chat");
}

#[test]
fn browser_chat_offers_the_model_only_a_scoped_tokens_tools() {
    scenario("chat_scoped");
}

#[test]
fn browser_chat_without_a_chat_section_says_how_to_turn_it_on() {
    scenario("chat_disabled");
}

#[test]
fn browser_console_opens_without_login_and_sends_no_token_when_the_server_has_none() {
    scenario("no_token");
}

#[test]
fn browser_console_loads_fast_works_by_keyboard_fits_380_px_and_follows_dark_mode() {
    // Prints the first load's milliseconds and the assets' size (cargo test -- --nocapture).
    scenario("keyboard_narrow_dark");
}
