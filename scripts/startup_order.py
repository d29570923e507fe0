#!/usr/bin/env python3
"""Turns a callgrind profile of `ctx serve` starting up into link/startup.syms.

Usage: startup_order.py CALLGRIND_OUT CTX_BINARY > link/startup.syms

Every function of the ctx binary that ran becomes one line: the name of its symbol, which is also
the name of its input section after `.text.` (rustc and cc both compile with function sections).
build.rs turns the list into a linker script that places those sections together.

Rust's legacy mangling ends each name in a hash (`17h<16 hex>E`) that changes with the compiler,
the profile and the versions in Cargo.lock. Where only one function of the binary has that name
without its hash, the line keeps `17h*` instead, so it still matches after such a change. Where a
generic function has many instances, the hash stays: a glob would pull in every instance.
"""
import collections
import os
import re
import subprocess
import sys

RUST_HASH = re.compile(r"^(_ZN.*17h)[0-9a-f]{16}E")
SAFE = re.compile(r"[A-Za-z0-9_.$*]+")


def executed(profile, binary):
    """Names of the functions of `binary` that have cost in a callgrind output file, in order."""
    objects, functions = {}, {}
    current, seen, names = None, set(), []

    def name(spec, table):
        # callgrind compresses repeated names: "(12) name" defines id 12, "(12)" refers to it.
        m = re.match(r"\((\d+)\)(?: (.*))?$", spec)
        if not m:
            return spec
        if m.group(2):
            table[m.group(1)] = m.group(2)
        return table.get(m.group(1))

    with open(profile, errors="replace") as lines:
        for line in lines:
            line = line.rstrip("\n")
            if line.startswith("ob="):
                current = name(line[3:], objects)
            elif line.startswith("cob="):
                name(line[4:], objects)
            elif line.startswith("cfn="):
                name(line[4:], functions)
            elif line.startswith("fn="):
                fn = name(line[3:], functions)
                if current and os.path.realpath(current) == binary and fn not in seen:
                    seen.add(fn)
                    names.append(fn)
    return names


def main():
    profile, binary = sys.argv[1], os.path.realpath(sys.argv[2])
    nm = subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
    instances = collections.Counter()
    for line in nm.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            instances[RUST_HASH.sub(r"\g<1>*", parts[2].split(".llvm.")[0])] += 1

    print("# Functions that `ctx serve` runs while it starts and answers /health, from")
    print("# scripts/startup-order. build.rs places them together in release builds. Regenerate with")
    print("# ./scripts/startup-order after changing what the server does at start.")
    written = set()
    names = executed(profile, binary)
    if len(names) < 1000:
        sys.exit(f"{profile}: only {len(names)} functions of {binary} ran; the profile is incomplete")
    for fn in names:
        fn = re.sub(r"'\d+$", "", fn)  # callgrind's marker for a recursion level
        fn = re.sub(r"\.llvm\.\d+$", ".llvm.*", fn)  # ThinLTO's suffix for promoted locals
        glob = RUST_HASH.sub(r"\g<1>*", fn.split(".llvm.")[0])
        if glob != fn.split(".llvm.")[0] and instances[glob] <= 1:
            fn = RUST_HASH.sub(r"\g<1>*", fn)
        if not SAFE.fullmatch(fn) or fn.startswith("0x") or fn in written:
            continue  # "(below main)", raw addresses of code without a symbol
        written.add(fn)
        print(fn)


if __name__ == "__main__":
    main()
