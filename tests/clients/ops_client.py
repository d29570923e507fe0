"""Operator-side probes of a running ctx: one tool call that may be held for approval, and /metrics.

Usage:
    ops_client.py call --url http://127.0.0.1:PORT/mcp --token TOKEN --tool NAME \\
        --args '{"message": "x"}' --answer approve|decline|none
    ops_client.py metrics --url http://127.0.0.1:PORT/metrics --token TOKEN

`call` opens a 2025-11-25 session with the official Python MCP SDK (`mcp` 2.3.0:
streamable_http_client + ClientSession, sending `Authorization: Bearer TOKEN`), initializes,
and calls the tool once. How it answers an elicitation/create the server sends meanwhile:
    approve  accept, with content {"approve": true}
    decline  decline
    none     no elicitation callback at all, so the client does not declare the capability
It prints one JSON object:
    {"isError": bool, "text": "<the text blocks joined by newlines>",
     "structured": <structuredContent or null>,
     "elicited": [{"message": str, "schema": {...}}, ...]}
(a URL-mode elicitation, which ctx should not send, is recorded with "schema": null and its
"url", and declined).

`metrics` GETs the URL with the same bearer token, requires a text/plain Content-Type, and
parses the body with the Prometheus client library's own text parser. It prints one JSON object:
    {"families": {"<family>": {"type": "counter|gauge|histogram|summary|unknown|...",
                               "samples": [{"name": str, "labels": {...}, "value": float}]}}}
Names are as the parser gives them: a counter's family drops `_total` (family `ctx_tool_calls`,
samples `ctx_tool_calls_total`). A non-finite value is written as the string "+Inf", "-Inf" or
"NaN", since JSON has no number for it.

Exit status 0 when the call completed (whatever its isError) or the metrics parsed. A failed
check (a JSON-RPC error instead of a result, a wrong Content-Type, an HTTP error status, a
family listed twice) prints `FAIL: <why>` on stderr and exits 1; anything unexpected (no
connection, a parse error from the Prometheus parser, the whole run past the timeout) prints a
traceback and `FAIL: ...` on stderr and exits 2. Driven by the Rust ops tests, which start the
server and pass its URL and token.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import traceback
import urllib.error
import urllib.request
from typing import Any

import anyio
import mcp
import httpx2
from mcp import ClientSession, types
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from prometheus_client.parser import text_string_to_metric_families

# Seconds: one HTTP request (connect, write, read) and the whole run.
REQUEST_TIMEOUT = 50
RUN_TIMEOUT = 60


class CheckFailed(Exception):
    """A check did not hold; the message says why."""


def emit(value: Any) -> None:
    """The one JSON object on stdout (strict JSON: no NaN or Infinity)."""
    print(json.dumps(value, allow_nan=False), flush=True)


# --- call -------------------------------------------------------------------------------------


class Elicitations:
    """The session's elicitation_callback: records each request, answers as --answer says."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.seen: list[dict[str, Any]] = []

    async def handle(self, context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        if isinstance(params, types.ElicitRequestURLParams):
            self.seen.append({"message": params.message, "schema": None, "url": params.url})
            return types.ElicitResult(action="decline")
        self.seen.append({"message": params.message, "schema": params.requested_schema})
        if self.answer == "approve":
            return types.ElicitResult(action="accept", content={"approve": True})
        return types.ElicitResult(action="decline")


class Inbox:
    """The session's message_handler: keeps transport errors for the failure message."""

    def __init__(self) -> None:
        self.errors: list[Exception] = []

    async def handle(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.errors.append(message)


async def call(args: argparse.Namespace) -> None:
    try:
        arguments = json.loads(args.args)
    except json.JSONDecodeError as e:
        raise CheckFailed(f"--args is not JSON: {e}") from e
    if not isinstance(arguments, dict):
        raise CheckFailed(f"--args must be a JSON object, got {args.args!r}")

    elicitations = Elicitations(args.answer)
    inbox = Inbox()
    headers = {"Authorization": f"Bearer {args.token}"}
    timeout = httpx2.Timeout(REQUEST_TIMEOUT)
    callback = elicitations.handle if args.answer != "none" else None
    if args.era == "2026":
        # mcp.Client negotiates 2026-07-28 (stateless) and answers an input-required result
        # itself: it runs the callback and calls again with the answer.
        with anyio.fail_after(RUN_TIMEOUT):
            async with create_mcp_http_client(headers=headers, timeout=timeout) as http_client:
                transport = streamable_http_client(args.url, http_client=http_client)
                async with mcp.Client(transport, mode="auto", read_timeout_seconds=REQUEST_TIMEOUT,
                                      elicitation_callback=callback) as client:
                    if client.protocol_version != "2026-07-28":
                        raise CheckFailed(f"mode='auto' negotiated {client.protocol_version}, expected 2026-07-28")
                    try:
                        result = await client.call_tool(args.tool, arguments)
                    except MCPError as e:
                        raise CheckFailed(f"tools/call {args.tool}: JSON-RPC error {e.code}: {e.message} "
                                          f"(data {e.data!r})") from e
        emit_result(result, elicitations)
        return
    with anyio.fail_after(RUN_TIMEOUT):
        async with create_mcp_http_client(headers=headers, timeout=timeout) as http_client:
            async with streamable_http_client(args.url, http_client=http_client) as (read, write):
                async with ClientSession(
                    read,
                    write,
                    read_timeout_seconds=REQUEST_TIMEOUT,
                    # With --answer none the session gets no callback, so initialize does not
                    # declare the elicitation capability.
                    elicitation_callback=callback,
                    message_handler=inbox.handle,
                ) as session:
                    try:
                        await session.initialize()
                    except MCPError as e:
                        raise CheckFailed(f"initialize: JSON-RPC error {e.code}: {e.message} "
                                          f"(transport errors: {inbox.errors})") from e
                    try:
                        result = await session.call_tool(args.tool, arguments, read_timeout_seconds=REQUEST_TIMEOUT)
                    except MCPError as e:
                        raise CheckFailed(f"tools/call {args.tool}: JSON-RPC error {e.code}: {e.message} "
                                          f"(data {e.data!r}; transport errors: {inbox.errors})") from e

    emit_result(result, elicitations)


def emit_result(result: types.CallToolResult, elicitations: Elicitations) -> None:
    """The call's outcome as the one JSON object on stdout."""
    emit({
        "isError": bool(result.is_error),
        "text": "\n".join(block.text for block in result.content if isinstance(block, types.TextContent)),
        "structured": result.structured_content,
        "elicited": elicitations.seen,
    })


# --- metrics ----------------------------------------------------------------------------------


def number(value: float) -> float | str:
    """A sample value for strict JSON: a float (the parser gives ints for whole numbers), and
    non-finite values as Prometheus spells them."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return value


def parse_metrics(text: str) -> dict[str, Any]:
    """The exposition text as {"families": ...}; the parser's ValueErrors propagate."""
    families: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        if family.name in families:
            raise CheckFailed(f"metric family {family.name!r} appears twice (its lines are not one group)")
        families[family.name] = {
            "type": family.type,
            "samples": [
                {"name": s.name, "labels": dict(s.labels), "value": number(s.value)} for s in family.samples
            ],
        }
    return {"families": families}


def fetch_metrics(url: str, token: str) -> str:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=RUN_TIMEOUT) as response:
            content_type = response.headers.get("Content-Type", "")
            body = response.read()
    except urllib.error.HTTPError as e:
        raise CheckFailed(f"GET {url}: HTTP {e.code}: {e.read()[:500]!r}") from e
    if not content_type.startswith("text/plain"):
        raise CheckFailed(f"GET {url}: Content-Type {content_type!r}, expected text/plain (body {body[:200]!r})")
    return body.decode("utf-8")


def metrics(args: argparse.Namespace) -> None:
    emit(parse_metrics(fetch_metrics(args.url, args.token)))


# --- main -------------------------------------------------------------------------------------


def find(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The `kind` exception inside `error`, which task groups may have wrapped in exception groups."""
    if isinstance(error, kind) and not isinstance(error, BaseExceptionGroup):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            if (found := find(inner, kind)) is not None:
                return found
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    call_parser = commands.add_parser("call", help="call one tool on a 2025-11-25 session")
    call_parser.add_argument("--url", required=True, help="Streamable HTTP endpoint, e.g. http://127.0.0.1:PORT/mcp")
    call_parser.add_argument("--token", required=True, help="bearer token")
    call_parser.add_argument("--tool", required=True, help="tool name")
    call_parser.add_argument("--args", default="{}", help="the tool arguments, a JSON object (default {})")
    call_parser.add_argument("--answer", required=True, choices=["approve", "decline", "none"],
                             help="how to answer an elicitation: accept {approve: true}, decline, "
                                  "or none (no elicitation capability)")
    call_parser.add_argument("--era", default="2025", choices=["2025", "2026"],
                             help="2025: a 2025-11-25 session (ClientSession); 2026: mcp.Client negotiating "
                                  "2026-07-28 (stateless, input-required results)")

    metrics_parser = commands.add_parser("metrics", help="GET and parse Prometheus metrics")
    metrics_parser.add_argument("--url", required=True, help="e.g. http://127.0.0.1:PORT/metrics")
    metrics_parser.add_argument("--token", required=True, help="bearer token")

    args = parser.parse_args()
    try:
        if args.command == "call":
            anyio.run(call, args)
        else:
            metrics(args)
    except BaseException as error:  # noqa: BLE001 - reported, then the exit status says it
        if isinstance(error, SystemExit):
            raise
        failure = find(error, CheckFailed)
        if failure is not None:
            print(f"FAIL: {failure}", file=sys.stderr, flush=True)
            sys.exit(1)
        traceback.print_exception(error)
        if find(error, TimeoutError) is not None:
            print(f"FAIL: timed out (a request, or the whole run past {RUN_TIMEOUT} s): {error!r}",
                  file=sys.stderr, flush=True)
            sys.exit(2)
        cause = find(error, Exception) or error
        print(f"FAIL: unexpected {type(cause).__name__}: {cause}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
