//! The startup order of release builds: the linker script `build.rs` makes from `link/*.syms`,
//! checked by linking a small C program with the system's C compiler and linker.

#[path = "../../link/script.rs"]
mod script;

use std::collections::HashMap;
use std::process::Command;

use script::{linker_script, without_hash};

#[test]
fn a_hashed_rust_name_becomes_a_glob_and_no_other_name_does() {
    assert_eq!(without_hash("_ZN4core3fmt5write17h0123456789abcdefE").as_deref(), Some("_ZN4core3fmt5write17h*"));
    assert_eq!(
        without_hash("_ZN4core3fmt5write17h0123456789abcdefE.llvm.123456").as_deref(),
        Some("_ZN4core3fmt5write17h*")
    );
    for name in [
        "_ZN4core3fmt5write17h*",                 // already a glob
        "_ZN4core3fmt5write17h0123456789abcdeE",  // 15 digits
        "_ZN4core3fmt5write17h0123456789abcdegE", // not hex
        "_RNvNtCsjrHSEGnQ3l9_3std2rt19lang_start_internal",
        "sqlite3VdbeExec",
        "x17h0123456789abcdefE", // not mangled
    ] {
        assert_eq!(without_hash(name), None, "{name}");
    }
}

#[test]
fn every_line_of_the_lists_makes_a_valid_pattern() {
    for list in ["startup.syms", "serve.syms"] {
        let path = format!("{}/link/{list}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("read the list");
        let names: Vec<&str> = text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
        assert!(names.len() > 100, "{path} lists only {} functions", names.len());
        for name in names {
            // Characters a linker script pattern takes literally, plus the `*` of a glob.
            assert!(
                name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.$*".contains(&b)),
                "{path}: {name:?} is not a plain symbol name"
            );
        }
    }
}

/// Links a C program whose functions sit in their own sections (`-ffunction-sections`, as rustc
/// and cc-rs compile) with the script, and returns the output section each symbol landed in.
fn link(dir: &std::path::Path, source: &str, script: &str) -> HashMap<String, String> {
    let (c, ld, bin) = (dir.join("t.c"), dir.join("order.ld"), dir.join("t"));
    std::fs::write(&c, source).unwrap();
    std::fs::write(&ld, script).unwrap();
    let out = Command::new("cc")
        .args(["-O2", "-fno-inline", "-ffunction-sections", "-o"])
        .arg(&bin)
        .arg(&c)
        .arg(format!("-Wl,-T,{}", ld.display()))
        .output()
        .expect("run cc (the C compiler Rust links with)");
    assert!(out.status.success(), "cc failed:\n{}\n{script}", String::from_utf8_lossy(&out.stderr));
    assert!(Command::new(&bin).status().unwrap().success(), "the linked program does not run");

    let sections = Command::new("readelf").arg("-SW").arg(&bin).output().expect("run readelf");
    let ranges: Vec<(String, u64, u64)> = String::from_utf8_lossy(&sections.stdout)
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(']').nth(1)?.split_whitespace().collect();
            let start = u64::from_str_radix(fields.get(2)?, 16).ok()?;
            let size = u64::from_str_radix(fields.get(4)?, 16).ok()?;
            Some((fields[0].to_string(), start, start + size))
        })
        .collect();
    let symbols = Command::new("nm").arg(&bin).output().expect("run nm");
    String::from_utf8_lossy(&symbols.stdout)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let addr = u64::from_str_radix(fields.next()?, 16).ok()?;
            let name = fields.nth(1)?;
            let (section, _, _) = ranges.iter().find(|(_, start, end)| (*start..*end).contains(&addr))?;
            Some((name.to_string(), section.clone()))
        })
        .collect()
}

#[test]
fn the_script_places_listed_functions_first_and_other_instances_of_generics_after() {
    // Names with `$` and a 16-digit hash, as rustc mangles them, through asm labels.
    // Distinct bodies, so that no two functions fold into one.
    let source = r#"
        volatile int sink;
        void listed(void) __asm__("_ZN4demo4sort$LT$T$GT$17h0123456789abcdefE");
        void listed(void) { sink = 1; }
        void sibling(void) __asm__("_ZN4demo4sort$LT$T$GT$17hfedcba9876543210E");
        void sibling(void) { sink = 2; }
        void unique(void) __asm__("_ZN4demo6unique17h1111111111111111E");
        void unique(void) { sink = 3; }
        __attribute__((cold)) void cold_listed(void) { sink = 4; }
        void served(void) { sink = 5; }
        void unlisted(void) { sink = 6; }
        int main(void) { listed(); sibling(); unique(); cold_listed(); served(); unlisted(); return sink != 6; }
    "#;
    let startup = "# a comment\n\n_ZN4demo4sort$LT$T$GT$17h0123456789abcdefE\n_ZN4demo6unique17h*\ncold_listed\n";
    let serve = "served\nnot_in_this_program\n";
    let dir = tempfile::tempdir().unwrap();
    let placed = link(dir.path(), source, &linker_script(&[("startup_order", startup), ("serve_order", serve)]));

    let at =
        |name: &str| placed.get(name).map(String::as_str).unwrap_or_else(|| panic!("{name} not found: {placed:?}"));
    assert_eq!(at("_ZN4demo4sort$LT$T$GT$17h0123456789abcdefE"), ".text.startup_order");
    assert_eq!(at("_ZN4demo6unique17h1111111111111111E"), ".text.startup_order", "a glob line");
    assert_eq!(at("cold_listed"), ".text.startup_order", "a cold function, in .text.unlikely.*");
    assert_eq!(at("served"), ".text.serve_order");
    assert_eq!(at("_ZN4demo4sort$LT$T$GT$17hfedcba9876543210E"), ".text.generic_order", "another instance");
    assert_eq!(at("unlisted"), ".text");
}
