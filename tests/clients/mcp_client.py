"""Drive a running ctx with the official Python MCP SDK (`mcp` 2.3.0) and check what it sees.

Usage:
    mcp_client.py --workdir DIR --http http://127.0.0.1:PORT/mcp
    mcp_client.py --workdir DIR --stdio -- ctx --config DIR/ctx.toml serve mcp --stdio

DIR is the served copy of tests/clients/mcp_workspace (with the shipped tools/echo.lua copied
in and `ctx sync` already run). The list_changed check edits it: it writes tools/added.lua and
appends a [tools.script.added] section to ctx.toml, and leaves both in place, so every run needs
a fresh copy.

Over HTTP it runs the checks on a 2025-11-25 session (streamable_http_client + ClientSession),
then a short second pass with `mcp.Client(url, mode="auto")`, which must negotiate 2026-07-28
(stateless; skip it with --skip-2026). Over stdio only the session checks run.

Prints one `ok: <check>` line per passed check. The first failed check ends the run with a
`FAIL: <check>: <why>` line on stderr and exit status 1 (2 for anything unexpected).
Driven by the Rust client tests, which start the server and pass its URL or command.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import traceback
from typing import Any

import anyio
import mcp
from mcp import ClientSession, StdioServerParameters, stdio_client, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

INVALID_PARAMS = -32602
# Tools every run must see: the built-ins and the fixture workspace's.
EXPECTED_TOOLS = {"search", "get", "sources", "echo", "slow", "kb_search", "fails", "steps"}
# Seconds: one request, the whole run, and the wait for notifications/tools/list_changed.
REQUEST_TIMEOUT = 30
RUN_TIMEOUT = 180
LIST_CHANGED_TIMEOUT = 10

ADDED_LUA = """\
-- added: written by tests/clients/mcp_client.py while the server runs.
tool = {
    name = "added",
    description = "Added while the server runs; shows that the tool list reloads.",
}

function tool.execute()
    return "added works"
end
"""
ADDED_SECTION = '\n[tools.script.added]\npath = "tools/added.lua"\n'


class CheckFailed(Exception):
    """A check did not hold; the message says which and why."""


ADDED_AGENT_SECTION = """

[agents.inline.added-agent]
description = "Added while the server runs."
system_prompt = "Fresh."
"""


def ok(check: str) -> None:
    print(f"ok: {check}", flush=True)


def require(condition: Any, check: str, why: str) -> None:
    if not condition:
        raise CheckFailed(f"{check}: {why}")


def texts(result: types.CallToolResult) -> list[str]:
    return [block.text for block in result.content if isinstance(block, types.TextContent)]


def show(result: types.CallToolResult) -> str:
    """A result, short enough for a failure message."""
    return json.dumps(result.model_dump(by_alias=True, mode="json", exclude_none=True))[:800]


class Inbox:
    """The session's message_handler: counts tools/list_changed, keeps transport errors."""

    def __init__(self) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[str](100)
        self._prompts_send, self._prompts_receive = anyio.create_memory_object_stream[str](100)
        self.errors: list[Exception] = []

    async def handle(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.errors.append(message)
        elif isinstance(message, types.ToolListChangedNotification):
            self._send.send_nowait(message.method)
        elif isinstance(message, types.PromptListChangedNotification):
            self._prompts_send.send_nowait(message.method)

    async def next_prompts_changed(self, seconds: float) -> bool:
        """Waits up to `seconds` for a notifications/prompts/list_changed; False on timeout."""
        with anyio.move_on_after(max(seconds, 0)):
            await self._prompts_receive.receive()
            return True
        return False

    async def next_list_changed(self, seconds: float) -> bool:
        """Waits up to `seconds` for a notifications/tools/list_changed; False on timeout."""
        with anyio.move_on_after(max(seconds, 0)):
            await self._receive.receive()
            return True
        return False


async def list_all_tools(session: ClientSession, check: str) -> tuple[list[types.Tool], int]:
    """Every page of tools/list, following nextCursor, and how many pages there were."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    pages = 0
    while True:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None
        page = await session.list_tools(params=params)
        pages += 1
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
        require(pages < 100, check, f"more than 100 pages; the cursor never ends (last {cursor!r})")
    names = [t.name for t in tools]
    require(len(names) == len(set(names)), check, f"a tool is listed twice across pages: {names}")
    return tools, pages


async def call_expecting_error(session: ClientSession, check: str, name: str, arguments: dict[str, Any]) -> MCPError:
    """Calls a tool that must fail with a JSON-RPC error (not a result) and returns the error."""
    try:
        result = await session.call_tool(name, arguments, read_timeout_seconds=REQUEST_TIMEOUT)
    except MCPError as e:
        return e
    raise CheckFailed(f"{check}: expected a JSON-RPC error, got a result: {show(result)}")


async def session_checks(session: ClientSession, inbox: Inbox, workdir: pathlib.Path) -> None:
    check = "initialize"
    init = await session.initialize()
    require(init.server_info.name == "ctx", check, f"server name {init.server_info.name!r}, expected 'ctx'")
    require(init.capabilities.tools is not None, check, "the server does not declare the tools capability")
    ok(f"initialize (server {init.server_info.name} {init.server_info.version}, protocol {init.protocol_version})")

    check = "tools/list"
    tools, pages = await list_all_tools(session, check)
    names = [t.name for t in tools]
    for tool in tools:
        require(tool.description, check, f"tool {tool.name!r} has no description")
        require(
            isinstance(tool.input_schema, dict) and tool.input_schema.get("type") == "object",
            check,
            f"tool {tool.name!r} inputSchema is not an object schema: {tool.input_schema!r}",
        )
    missing = EXPECTED_TOOLS - set(names)
    require(not missing, check, f"missing {sorted(missing)}; listed {names}")
    ok(f"tools/list ({len(tools)} tools in {pages} page(s))")

    check = "call echo"
    result = await session.call_tool("echo", {"message": "hi"}, read_timeout_seconds=REQUEST_TIMEOUT)
    require(not result.is_error, check, f"isError result: {show(result)}")
    structured = result.structured_content
    require(isinstance(structured, dict) and structured.get("message") == "hi", check,
            f"structuredContent {structured!r}, expected message 'hi'")
    require(any("hi" in t for t in texts(result)), check, f"no text block with the message: {show(result)}")
    ok("call echo (structuredContent and a text block)")

    check = "call kb_search (context.search)"
    result = await session.call_tool("kb_search", {"query": "deploy"}, read_timeout_seconds=REQUEST_TIMEOUT)
    require(not result.is_error, check, f"isError result: {show(result)}")
    everything = " ".join(texts(result)) + json.dumps(result.structured_content)
    require("Deploy runbook" in everything, check, f"no 'Deploy runbook' in the result: {show(result)}")
    ok("call kb_search (found 'Deploy runbook')")

    check = "invalid arguments"
    error = await call_expecting_error(session, check, "echo", {"repeat": "x"})
    require(error.code == INVALID_PARAMS, check, f"error code {error.code} ({error.message}), expected {INVALID_PARAMS}")
    require(error.data is not None, check, f"the error carries no data: {error.message}")
    ok(f"invalid arguments -> {error.code} with data ({error.message})")

    check = "unknown tool"
    error = await call_expecting_error(session, check, "no_such_tool", {})
    require(error.code == INVALID_PARAMS, check, f"error code {error.code} ({error.message}), expected {INVALID_PARAMS}")
    ok(f"unknown tool -> {error.code} ({error.message})")

    check = "script error"
    result = await session.call_tool("fails", {}, read_timeout_seconds=REQUEST_TIMEOUT)
    require(result.is_error, check, f"expected isError true: {show(result)}")
    require(any("on purpose" in t for t in texts(result)), check, f"no 'on purpose' in the text: {show(result)}")
    ok("script error -> isError result")

    check = "timeout"
    started = anyio.current_time()
    result = await session.call_tool("slow", {}, read_timeout_seconds=REQUEST_TIMEOUT)
    took = anyio.current_time() - started
    require(result.is_error, check, f"expected isError true: {show(result)}")
    require(any("timed out" in t for t in texts(result)), check, f"no 'timed out' in the text: {show(result)}")
    result = await session.call_tool("echo", {"message": "still here"}, read_timeout_seconds=REQUEST_TIMEOUT)
    require(not result.is_error and (result.structured_content or {}).get("message") == "still here", check,
            f"echo after the timeout: {show(result)}")
    ok(f"timeout -> isError after {took:.1f} s, and the server still answers")

    check = "progress"
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    result = await session.call_tool("steps", {"count": 3, "delay": 0.1}, read_timeout_seconds=REQUEST_TIMEOUT,
                                      progress_callback=on_progress)
    before_result = list(seen)
    require(not result.is_error, check, f"isError result: {show(result)}")
    require(len(before_result) >= 2, check,
            f"{len(before_result)} notifications/progress before the result, expected at least 2: {before_result}")
    values = [p for p, _, _ in before_result]
    require(values == sorted(values), check, f"progress went backwards: {values}")
    ok(f"progress ({len(before_result)} notifications before the result: {values})")

    await prompt_checks(session)
    await list_changed_checks(session, inbox, workdir)


async def prompt_checks(session: ClientSession) -> None:
    """Agents are MCP prompts: list them, resolve one, and get -32602 for the caller's mistakes."""
    check = "prompts/list"
    listed = await session.list_prompts()
    by_name = {p.name: p for p in listed.prompts}
    require("oncall-helper" in by_name, check, f"no oncall-helper prompt in {sorted(by_name)}")
    args = {a.name: a for a in by_name["oncall-helper"].arguments or []}
    require("service" in args and args["service"].required, check, f"service should be a required argument: {args}")
    ok(f"prompts/list ({len(listed.prompts)} prompt(s), arguments with required flags)")

    check = "prompts/get"
    got = await session.get_prompt("oncall-helper", {"service": "payments"})
    text = " ".join(m.content.text for m in got.messages if isinstance(m.content, types.TextContent))
    require("payments" in text, check, f"the argument is not in the prompt: {text!r}")
    ok("prompts/get (argument filled in)")

    for check, name, arguments in [("unknown prompt", "nope", {}), ("missing argument", "oncall-helper", {})]:
        try:
            await session.get_prompt(name, arguments)
        except MCPError as e:
            require(e.code == -32602, check, f"expected -32602, got {e.code}: {e}")
            ok(f"{check} -> -32602 ({e})")
            continue
        raise CheckFailed(f"{check}: expected a JSON-RPC error")


async def list_changed_checks(session: ClientSession, inbox: Inbox, workdir: pathlib.Path) -> None:
    check = "tools/list_changed"
    config = workdir / "ctx.toml"
    (workdir / "tools" / "added.lua").write_text(ADDED_LUA)
    with config.open("a") as f:
        f.write(ADDED_SECTION)

    # The server may reload once for the script and once more for ctx.toml, so keep waiting
    # until a listing after a notification has the new tool.
    deadline = anyio.current_time() + LIST_CHANGED_TIMEOUT
    notifications = 0
    names: list[str] = []
    while "added" not in names:
        if not await inbox.next_list_changed(deadline - anyio.current_time()):
            require(notifications, check,
                    f"no notifications/tools/list_changed within {LIST_CHANGED_TIMEOUT} s of adding tools/added.lua "
                    f"and its [tools.script.added] section (transport errors: {inbox.errors})")
            raise CheckFailed(f"{check}: {notifications} notification(s) within {LIST_CHANGED_TIMEOUT} s, "
                              f"but tools/list still lacks 'added': {names}")
        notifications += 1
        names = [t.name for t in (await list_all_tools(session, check))[0]]
    ok(f"tools/list_changed ({notifications} notification(s); 'added' is listed)")

    check = "call added"
    result = await session.call_tool("added", {}, read_timeout_seconds=REQUEST_TIMEOUT)
    require(not result.is_error and any("added works" in t for t in texts(result)), check, f"unexpected result: {show(result)}")
    ok("call added")

    # Agents reload too: a new [agents.inline] section is announced as a prompt list change.
    check = "prompts/list_changed"
    with config.open("a") as f:
        f.write(ADDED_AGENT_SECTION)
    deadline = anyio.current_time() + LIST_CHANGED_TIMEOUT
    prompts: list[str] = []
    while "added-agent" not in prompts:
        require(await inbox.next_prompts_changed(deadline - anyio.current_time()), check,
                f"no notifications/prompts/list_changed with 'added-agent' listed within {LIST_CHANGED_TIMEOUT} s "
                f"(prompts: {prompts}; transport errors: {inbox.errors})")
        prompts = [p.name for p in (await session.list_prompts()).prompts]
    ok("prompts/list_changed ('added-agent' is listed)")


async def modern_checks(url: str) -> None:
    """A short pass on the 2026-07-28 (stateless) era: discover, tools/list, echo."""
    check = "2026 era connect"
    async with mcp.Client(url, mode="auto", read_timeout_seconds=REQUEST_TIMEOUT) as client:
        require(client.protocol_version == "2026-07-28", check,
                f"mode='auto' negotiated {client.protocol_version}, expected 2026-07-28 "
                "(does the server answer server/discover?)")
        name = client.server_info.name if client.server_info else None
        ok(f"2026 era connect (protocol {client.protocol_version}, server {name})")

        check = "2026 era tools/list"
        tools: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(100):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        else:
            raise CheckFailed(f"{check}: more than 100 pages")
        names = {t.name for t in tools}
        missing = EXPECTED_TOOLS - names
        require(not missing, check, f"missing {sorted(missing)}; listed {sorted(names)}")
        ok(f"2026 era tools/list ({len(tools)} tools)")

        check = "2026 era call echo"
        result = await client.call_tool("echo", {"message": "hi 2026"})
        require(not result.is_error, check, f"isError result: {show(result)}")
        structured = result.structured_content
        require(isinstance(structured, dict) and structured.get("message") == "hi 2026", check,
                f"structuredContent {structured!r}")
        require(texts(result), check, f"no text block: {show(result)}")
        ok("2026 era call echo")


def check_workdir(workdir: pathlib.Path) -> None:
    """The list_changed check adds a tool to the workspace, so it must not be there yet."""
    check = "workdir"
    config = workdir / "ctx.toml"
    require(config.is_file() and (workdir / "tools").is_dir(), check, f"no ctx.toml and tools/ in {workdir}")
    already = any(line.strip() == "[tools.script.added]" for line in config.read_text().splitlines())
    require(not already, check, f"{config} already has [tools.script.added]; run on a fresh copy of the workspace")


async def run(args: argparse.Namespace) -> None:
    workdir = pathlib.Path(args.workdir)
    check_workdir(workdir)
    inbox = Inbox()
    with anyio.fail_after(RUN_TIMEOUT):
        if args.http:
            async with streamable_http_client(args.http) as (read, write):
                async with ClientSession(read, write, read_timeout_seconds=REQUEST_TIMEOUT,
                                         message_handler=inbox.handle) as session:
                    await session_checks(session, inbox, workdir)
            if not args.skip_2026:
                await modern_checks(args.http)
        else:
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            # The whole environment, not the SDK's short default list (RUST_LOG, HOME, ...).
            server = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
            async with stdio_client(server) as (read, write):
                async with ClientSession(read, write, read_timeout_seconds=REQUEST_TIMEOUT,
                                         message_handler=inbox.handle) as session:
                    await session_checks(session, inbox, workdir)


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
    transport = parser.add_mutually_exclusive_group(required=True)
    transport.add_argument("--http", metavar="URL", help="Streamable HTTP endpoint, e.g. http://127.0.0.1:PORT/mcp")
    transport.add_argument("--stdio", action="store_true", help="start the command after -- and talk over stdio")
    parser.add_argument("--workdir", required=True, help="the served workspace folder (ctx.toml, tools/)")
    parser.add_argument("--skip-2026", action="store_true", help="HTTP: skip the 2026-07-28 (mode='auto') pass")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="with --stdio: -- ctx --config ... serve mcp --stdio")
    args = parser.parse_args()
    if args.stdio and not [c for c in args.command if c != "--"]:
        parser.error("--stdio needs the server command after --")
    if args.http and args.command:
        parser.error(f"unexpected arguments with --http: {args.command}")

    try:
        anyio.run(run, args)
    except BaseException as error:  # noqa: BLE001 - reported, then the exit status says it
        if isinstance(error, SystemExit):
            raise
        failure = find(error, CheckFailed)
        if failure is not None:
            print(f"FAIL: {failure}", file=sys.stderr, flush=True)
            sys.exit(1)
        if find(error, TimeoutError) is not None:
            print(f"FAIL: timed out (a request, or the whole run past {RUN_TIMEOUT} s): {error!r}", file=sys.stderr, flush=True)
            sys.exit(1)
        traceback.print_exception(error)
        cause = find(error, Exception) or error
        print(f"FAIL: unexpected {type(cause).__name__}: {cause}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
