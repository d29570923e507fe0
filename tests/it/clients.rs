//! Third-party clients against a real server: the OpenAPI validator and a generated Python
//! client (both from PyPI, installed by `scripts/test-env`).

use std::process::Command;

use crate::common::{repo, run_ok, test_python};
use crate::http::start;

#[test]
fn openapi_spec_validator_accepts_the_checked_in_and_the_served_documents() {
    let Some(python) = test_python() else { return };
    let validator = python.with_file_name("openapi-spec-validator");
    let checked_in = repo().join("openapi/openapi.json");
    let out = run_ok(Command::new(&validator).arg(&checked_in));
    assert!(out.contains(": OK"), "{out}");

    // The served document adds one operation per Lua tool; it must be valid too.
    let s = start(None, &[]);
    let (status, served) = s.get("/openapi.json");
    assert_eq!(status, 200);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("served.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&served).unwrap()).unwrap();
    let out = run_ok(Command::new(&validator).arg(&path));
    assert!(out.contains(": OK"), "{out}");
}

#[test]
fn a_generated_python_client_calls_search_a_lua_tool_and_a_builtin_through_the_generic_call() {
    let Some(python) = test_python() else { return };
    let s = start(None, &[]);
    let dir = tempfile::tempdir().unwrap();
    let out = run_ok(
        Command::new(&python)
            .arg(repo().join("tests/clients/openapi_client.py"))
            .arg("--spec")
            .arg(repo().join("openapi/openapi.json"))
            .args(["--base-url", &s.base])
            .arg("--workdir")
            .arg(dir.path()),
    );
    assert!(out.contains("generated client: ok"), "{out}");
    assert!(out.contains("top 'Deploy runbook'"), "{out}");
    assert!(out.contains("sources through call_tool: ['filesystem:docs']"), "{out}");
}
