#!/usr/bin/env python3
"""Turns two callgrind profiles of the release `ctx serve` into link/startup.syms and link/serve.syms.

Usage: startup_order.py lists CTX_BINARY START_PROFILE SERVE_PROFILE OUT_DIR
       startup_order.py calls BASE_URL    (the REST and MCP calls of the serve phase)

START_PROFILE covers the server starting and answering a TCP probe and GET /health; SERVE_PROFILE
covers REST and MCP calls after that. Every function of the ctx binary that ran becomes one line
of the list of the phase it first ran in: the name of its symbol, which is also
the name of its input section after `.text.` (rustc and cc both compile with function sections).
build.rs turns the list into a linker script that places those sections together.

Rust's legacy mangling ends each name in a hash (`17h<16 hex>E`) that changes with the compiler,
the profile and the versions in Cargo.lock. Where only one function of the binary has that name
without its hash, the line keeps `17h*` instead, so it still matches after such a change. Where a
generic function has many instances, the hash stays, since a glob would pull in every instance;
build.rs puts that glob in a second section, after the first, as the fallback.
"""
import collections
import json
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


def normalize(names, instances):
    """Lines for the functions in `names`: hash globbed where the name is unique, sorted."""
    lines = set()
    for fn in names:
        fn = re.sub(r"'\d+$", "", fn)  # callgrind's marker for a recursion level
        fn = re.sub(r"\.llvm\.\d+$", ".llvm.*", fn)  # ThinLTO's suffix for promoted locals
        glob = RUST_HASH.sub(r"\g<1>*", fn.split(".llvm.")[0])
        if glob != fn.split(".llvm.")[0] and instances[glob] <= 1:
            fn = RUST_HASH.sub(r"\g<1>*", fn)
        if SAFE.fullmatch(fn) and not fn.startswith("0x"):  # not "(below main)" or a raw address
            lines.add(fn)
    # Sorted, so that a new profile changes only the lines that differ. The functions of one list
    # all run in its phase, so their order among themselves does not change what gets mapped.
    return sorted(lines)


HEADERS = {
    "startup.syms": """# Functions that `ctx serve` runs while it starts and answers a TCP probe and GET /health,
# from scripts/startup-order. build.rs places them first in release builds.""",
    "serve.syms": """# Functions that `ctx serve` runs to answer REST and MCP calls, beyond those in startup.syms,
# from scripts/startup-order. build.rs places them right after startup.syms.""",
}
FOOTER = """# Regenerate with ./scripts/startup-order after changing what the server does, the Rust
# toolchain or Cargo.lock (the http bench's idle RSS line shows when it is due)."""


def calls(base):
    """What an agent does: REST echo, search, get, sources and the tool list, and stateless MCP
    (2026-07-28) tools/call, 30 rounds so that every path is warm."""
    import urllib.request

    def request(path, body=None, headers=None):
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
        with urllib.request.urlopen(urllib.request.Request(base + path, data=data, headers=headers), timeout=60) as r:
            return r.read()

    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    mcp_call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"message": "hello"}, "_meta": meta}}
    mcp_headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
                   "Mcp-Method": "tools/call", "Mcp-Name": "echo"}
    queries = ["deploy", "rollback", "how do I roll back a deploy"]
    for i in range(30):
        request("/tools/echo", {"message": "hello"})
        found = json.loads(request("/tools/search", {"query": queries[i % len(queries)], "limit": 10}))
        if found.get("results"):
            request("/tools/get", {"id": found["results"][0]["id"]})
        request("/mcp", mcp_call, mcp_headers)
        request("/tools/list")
        request("/tools/sources")


def lists(binary, start, serve, out):
    binary = os.path.realpath(binary)
    nm = subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
    instances = collections.Counter()
    for line in nm.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            instances[RUST_HASH.sub(r"\g<1>*", parts[2].split(".llvm.")[0])] += 1

    at_start = executed(start, binary)
    started = set(at_start)
    serving = [fn for fn in executed(serve, binary) if fn not in started]
    for name, names in (("startup.syms", at_start), ("serve.syms", serving)):
        if len(names) < 500:
            profile = start if name == "startup.syms" else serve
            sys.exit(f"{profile}: only {len(names)} functions of {binary} ran; the profile is incomplete")
        with open(os.path.join(out, name), "w") as file:
            file.write(HEADERS[name] + "\n" + FOOTER + "\n")
            file.writelines(line + "\n" for line in normalize(names, instances))


if __name__ == "__main__":
    if sys.argv[1:2] == ["calls"]:
        calls(sys.argv[2])
    elif sys.argv[1:2] == ["lists"]:
        lists(*sys.argv[2:6])
    else:
        sys.exit(__doc__)
