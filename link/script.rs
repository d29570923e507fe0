//! The linker script that places the functions named in `link/*.syms` ahead of the rest of
//! `.text`. Shared by `build.rs` and the test in `tests/it/link_order.rs`.

use std::collections::HashSet;
use std::fmt::Write;

/// One output section per list, in the order given, then `.text.generic_order` with every
/// instance of the generic functions the lists name with their hash.
///
/// `lists` holds (section name, list text). A list has one symbol name per line, which is also
/// the name of the function's input section after `.text.` (rustc and cc compile with function
/// sections); `#` starts a comment line. The script augments the linker's default layout
/// (`INSERT BEFORE .text`), which GNU ld and lld understand.
pub fn linker_script(lists: &[(&str, &str)]) -> String {
    let mut script = String::from("SECTIONS {\n");
    let (mut generic, mut seen) = (String::new(), HashSet::new());
    for (section, list) in lists {
        let _ = writeln!(script, "  .text.{section} : {{");
        for name in list.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            // A cold function (`#[cold]`, or GCC's split-off parts) sits in `.text.unlikely.<name>`.
            let _ = writeln!(script, "    *(.text.{name} .text.unlikely.{name})");
            if let Some(glob) = without_hash(name).filter(|glob| seen.insert(glob.clone())) {
                let _ = writeln!(generic, "    *(.text.{glob} .text.unlikely.{glob})");
            }
        }
        script.push_str("  }\n");
    }
    let _ = write!(script, "  .text.generic_order : {{\n{generic}  }}\n}} INSERT BEFORE .text;\n");
    script
}

/// `_ZN…17h<16 hex digits>E…` (Rust's legacy mangling) with the hash and what follows it
/// replaced by `*`; `None` for any other name.
pub fn without_hash(name: &str) -> Option<String> {
    let at = name.rfind("17h")?;
    let hash = name.get(at + 3..at + 19)?;
    let ends = name[at + 19..].starts_with('E');
    let mangled = name.starts_with("_ZN") && ends && hash.bytes().all(|b| b.is_ascii_hexdigit());
    mangled.then(|| format!("{}17h*", &name[..at]))
}
