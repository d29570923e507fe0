"""MCP through a load balancer in front of ctx replicas, with the official Python MCP SDK.

Usage:
    mcp_replicas.py --url http://LB --token T --era 2025|2026 --calls N

2025-11-25: one session (streamable_http_client + ClientSession): initialize, tools/list, then N
`echo` calls. Every request after initialize names the session (Mcp-Session-Id), which only
the replica that made it knows: they all succeed only if the balancer keeps the session on it.
2026-07-28: `mcp.Client(mode="auto")` and N `echo` calls; stateless, any replica answers.

Prints `ok: <era> N`; otherwise `FAIL: <why>` on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import sys

import anyio
import mcp
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError


def http(token: str):
    return create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})


async def session_era(url: str, token: str, calls: int) -> int:
    async with streamable_http_client(f"{url}/mcp", http_client=http(token)) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            if init.protocol_version != "2025-11-25":
                raise SystemExit(f"FAIL: negotiated {init.protocol_version}")
            tools = await session.list_tools()
            if "echo" not in {t.name for t in tools.tools}:
                raise SystemExit("FAIL: no echo tool listed")
            done = 0
            for i in range(calls):
                result = await session.call_tool("echo", {"message": f"session call {i}"})
                if result.is_error or f"session call {i}" not in str(result.content):
                    raise SystemExit(f"FAIL: call {i} on the session: {result}")
                done += 1
            return done


async def stateless_era(url: str, token: str, calls: int) -> int:
    transport = streamable_http_client(f"{url}/mcp", http_client=http(token))
    async with mcp.Client(transport, mode="auto") as client:
        version = client.session._negotiated_version  # noqa: SLF001
        if version != "2026-07-28":
            raise SystemExit(f"FAIL: negotiated {version}")
        done = 0
        for i in range(calls):
            result = await client.call_tool("echo", {"message": f"stateless call {i}"})
            if result.is_error or f"stateless call {i}" not in str(result.content):
                raise SystemExit(f"FAIL: stateless call {i}: {result}")
            done += 1
        return done


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--era", choices=["2025", "2026"], required=True)
    args = parser.parse_args()
    with anyio.fail_after(120):
        era = session_era if args.era == "2025" else stateless_era
        print(f"ok: {args.era} {await era(args.url, args.token, args.calls)}", flush=True)


if __name__ == "__main__":
    try:
        anyio.run(main)
    except BaseExceptionGroup as group:
        for e in group.exceptions:
            print(f"FAIL: {e!r}: {getattr(e, 'data', None)}", file=sys.stderr)
        sys.exit(1)
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            sys.exit(1)
        raise
