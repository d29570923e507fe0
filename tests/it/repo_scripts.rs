//! The repository's own scripts, run on copies with stand-ins for the programs they call:
//! `scripts/test` stops, with its own message, when `scripts/test-env` or `scripts/pg up` fails.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::common::repo;

fn executable(path: &std::path::Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A `scripts/pg` that starts nothing and says where it did.
const PG_STAND_IN: &str =
    "#!/bin/sh\ncase \"$1\" in up) echo \"export CTX_TEST_PG_DIR='/tmp/ctx-pg.stand-in'\" ;; esac\n";

/// `scripts/test` in a copy of the repository's layout, where `scripts/test-env` is `env_script`,
/// `scripts/pg` is `pg_script`, and `cargo` (first on PATH) only records that it ran. Exit code,
/// stderr, whether cargo ran.
fn run_test_script(env_script: &str, pg_script: &str) -> (i32, String, bool) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    std::fs::create_dir_all(root.join("scripts")).unwrap();
    std::fs::copy(repo().join("scripts/test"), root.join("scripts/test")).unwrap();
    executable(&root.join("scripts/test-env"), env_script);
    executable(&root.join("scripts/pg"), pg_script);
    let ran = dir.path().join("cargo-ran");
    executable(&dir.path().join("bin/cargo"), &format!("#!/bin/sh\ntouch {}\n", ran.display()));
    let path = format!("{}:{}", dir.path().join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let output = Command::new("bash").arg(root.join("scripts/test")).env("PATH", path).output().unwrap();
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned(), ran.exists())
}

#[test]
fn scripts_test_stops_when_test_env_fails() {
    let (code, stderr, cargo_ran) = run_test_script(
        "#!/bin/sh\necho 'export CTX_TEST_PYTHON=/nowhere'\necho 'test-env: no venv' >&2\nexit 3\n",
        PG_STAND_IN,
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("test-env: no venv"), "test-env's own message comes first: {stderr}");
    assert!(stderr.contains("scripts/test: scripts/test-env failed (see above); fix it and re-run"), "{stderr}");
    assert!(!cargo_ran, "the tests ran after test-env failed");

    // With a test-env that works, the same copy goes on to cargo with its exports.
    let (code, stderr, cargo_ran) = run_test_script("#!/bin/sh\necho 'export CTX_TEST_PYTHON=/nowhere'\n", PG_STAND_IN);
    assert_eq!((code, cargo_ran), (0, true), "{stderr}");

    // A PostgreSQL that does not start stops the run too, with both messages.
    let (code, stderr, cargo_ran) = run_test_script(
        "#!/bin/sh\necho 'export CTX_TEST_PYTHON=/nowhere'\n",
        "#!/bin/sh\necho 'scripts/pg: no PostgreSQL server found' >&2\nexit 1\n",
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("scripts/pg: no PostgreSQL server found"), "{stderr}");
    assert!(stderr.contains("scripts/test: scripts/pg up failed (see above); fix it and re-run"), "{stderr}");
    assert!(!cargo_ran, "the tests ran without their PostgreSQL");
}
