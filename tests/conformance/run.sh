#!/usr/bin/env bash
# Runs the MCP conformance suite (@modelcontextprotocol/conformance) against a running ctx that
# serves a copy of tests/conformance/ctx.toml, in two releases:
#
#   0.1.16          the default "active" suite (2025-11-25 session wire), plus the pending
#                   json-schema-2020-12 scenario on its own
#   0.2.0-alpha.x   --requirements 2025-11-25: the scenarios that revision requires, plus the
#                   not-scored server-session-lifecycle, json-schema-2020-12, server-sse-polling
#   (--with-2026)   0.2.0-alpha.x again, each tools scenario on the 2026-07-28 stateless wire
#
# Usage: tests/conformance/run.sh [--with-2026] [--strict-baseline] URL [RESULTS_DIR]
#   URL          the MCP endpoint, http://127.0.0.1:PORT/mcp (127.0.0.1 or localhost: the DNS
#                rebinding scenario needs it)
#   RESULTS_DIR  default target/conformance; each release gets <dir>/<version>/ with suite.log
#                and results/server-<scenario>-<timestamp>/checks.json
#
# Prints one line per release, `conformance <version>: N passed, M failed, K not applicable`,
# with the failed checks under it. Scenarios listed in baseline-<version>.yml are "not
# applicable". Every scenario listed for that line in must-pass.txt has to pass. Exits 1 when an
# applicable scenario fails or a must-pass one does not pass (2 on a usage or setup problem);
# with --strict-baseline also when a baseline entry passes or a passing scenario is not listed.
# Node and the suite come from scripts/test-env: CTX_TEST_NODE and CTX_TEST_NODE_MODULES, or
# target/test-env when they are unset.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

usage() {
    sed -n '2,/^set -uo/p' "$0" | sed -e '/^set -uo/d' -e 's/^# \{0,1\}//' >&2
    exit 2
}

with_2026=false
strict=()
positional=()
while [ $# -gt 0 ]; do
    case "$1" in
        --with-2026) with_2026=true ;;
        --strict-baseline) strict=(--strict-baseline) ;;
        -h | --help) usage ;;
        -*) echo "run.sh: unknown option $1" >&2; usage ;;
        *) positional+=("$1") ;;
    esac
    shift
done
[ ${#positional[@]} -ge 1 ] && [ ${#positional[@]} -le 2 ] || usage
url=${positional[0]}
out=${positional[1]:-$repo/target/conformance}

node=${CTX_TEST_NODE:-$repo/target/test-env/nodebin/node}
modules=${CTX_TEST_NODE_MODULES:-$repo/target/test-env/node/node_modules}
stable="$modules/@modelcontextprotocol/conformance"
next="$modules/conformance-next"
for need in "$node" "$stable/dist/index.js" "$next/dist/index.js"; do
    if [ ! -e "$need" ]; then
        echo "run.sh: $need is missing; run: eval \"\$(scripts/test-env)\"" >&2
        exit 2
    fi
done

version_of() {
    "$node" -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).version)' "$1/package.json"
}

baseline_for() {
    local file="$here/baseline-$1.yml"
    if [ ! -f "$file" ]; then
        echo "run.sh: no $file; review the scenarios of conformance $1 and write it" >&2
        exit 2
    fi
    echo "$file"
}

# A fresh <out>/<name>/ for one run.
fresh_dir() {
    local dir="$out/$1"
    rm -rf "$dir"
    mkdir -p "$dir/results"
    echo "$dir"
}

status=0

# ---- 0.1.16: the active suite, then json-schema-2020-12 (pending there, so not in it) ----
v=$(version_of "$stable") || exit 2
baseline=$(baseline_for "$v") || exit 2
dir=$(fresh_dir "$v")
echo "run.sh: conformance $v against $url (log: $dir/suite.log)" >&2
"$node" "$stable/dist/index.js" server --url "$url" -o "$dir/results" \
    --expected-failures "$baseline" >"$dir/suite.log" 2>&1
suite_exit=$?
# On its own after the suite, so the suite's SUMMARY stays the last one in the log.
"$node" "$stable/dist/index.js" server --url "$url" --scenario json-schema-2020-12 \
    -o "$dir/results" >"$dir/json-schema-2020-12.log" 2>&1
echo "json-schema-2020-12 $?" >"$dir/exit-codes"
"$node" "$here/summarize.mjs" --label "conformance $v" --results "$dir/results" --log "$dir/suite.log" \
    --baseline "$baseline" --exit-codes "$dir/exit-codes" --must-pass "$here/must-pass.txt" \
    --expect-summary --suite-exit "$suite_exit" "${strict[@]}" || status=1

# ---- 0.2.0-alpha: the 2025-11-25 requirement set ----
v=$(version_of "$next") || exit 2
baseline=$(baseline_for "$v") || exit 2
dir=$(fresh_dir "$v")
echo "run.sh: conformance $v --requirements 2025-11-25 against $url (log: $dir/suite.log)" >&2
"$node" "$next/dist/index.js" server --url "$url" --requirements 2025-11-25 -o "$dir/results" \
    --expected-failures "$baseline" >"$dir/suite.log" 2>&1
suite_exit=$?
"$node" "$here/summarize.mjs" --label "conformance $v" --results "$dir/results" --log "$dir/suite.log" \
    --baseline "$baseline" --must-pass "$here/must-pass.txt" --expect-summary --suite-exit "$suite_exit" \
    "${strict[@]}" || status=1

# ---- optional: the tools scenarios on the 2026-07-28 stateless wire ----
# Not a suite run: the 2026-07-28 requirement set also needs server/discover diagnostics tools,
# multi-round-trip input_required results, caching hints and the SEP-2243 header checks.
if $with_2026; then
    dir=$(fresh_dir "$v-2026-07-28")
    echo "run.sh: conformance $v --spec-version 2026-07-28 against $url (logs: $dir/)" >&2
    : >"$dir/exit-codes"
    for scenario in tools-list tools-call-simple-text tools-call-image tools-call-audio \
        tools-call-embedded-resource tools-call-mixed-content tools-call-error tools-call-with-progress \
        json-schema-2020-12 dns-rebinding-protection server-sse-multiple-streams; do
        "$node" "$next/dist/index.js" server --url "$url" --spec-version 2026-07-28 --scenario "$scenario" \
            -o "$dir/results" >"$dir/$scenario.log" 2>&1
        echo "$scenario $?" >>"$dir/exit-codes"
    done
    "$node" "$here/summarize.mjs" --label "conformance $v @2026-07-28" --results "$dir/results" \
        --log "$dir/tools-list.log" --exit-codes "$dir/exit-codes" --must-pass "$here/must-pass.txt" \
        "${strict[@]}" || status=1
fi

exit "$status"
