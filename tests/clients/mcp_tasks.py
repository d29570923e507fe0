"""MCP tasks against a running ctx, in each era, with the official Python MCP SDK (`mcp` 2.3.0).

Usage:
    mcp_tasks.py --url http://127.0.0.1:PORT --era 2025|2026 --token T --other-token T2
                 --admin A --approver P CHECK [TASK_ID]

CHECK is one of:
    progress   a deploy of 3 s polled to completion, its progress messages seen on the way
    cancel     a long deploy cancelled midway: the task ends cancelled and the Lua run stopped
               (the call log has the call cancelled, well before its end)
    approval   a call that needs approval waits in input_required; approved through REST, it completes
    others     a task of --token is unknown to --other-token
    start      starts a long deploy as a task and prints `task: ID` (the caller then kills the server)
    lost       TASK_ID (started before a restart) reads failed, with the reason (both eras)

2025-11-25: a session (streamable_http_client + ClientSession); `tools/call` with `params.task`
goes through the session's dispatcher (the SDK's typed surface leaves 2025 tasks out), then
`tasks/get`, `tasks/result`, `tasks/list` and `tasks/cancel` through `send_request`.
2026-07-28: `mcp.Client(mode="auto")` with a client extension for `io.modelcontextprotocol/tasks`
that claims the `task` result and resolves it by polling `tasks/get` (how an SDK user adds the
extension); `tasks/cancel` and `tasks/get` are sent on the same session.

Prints `ok: <check>` when the check held; otherwise `FAIL: <why>` on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, ClassVar, Literal

import anyio
import httpx2
import mcp
import mcp_types as t
from mcp import ClientSession
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field

TERMINAL = {"completed", "failed", "cancelled"}
RUN_TIMEOUT = 60


class CheckFailed(Exception):
    pass


def require(condition: Any, why: str) -> None:
    if not condition:
        raise CheckFailed(why)


class Raw(BaseModel):
    model_config = ConfigDict(extra="allow")


# 2026-07-28: the extension's requests (the SDK's typed surface has none), each with the
# Mcp-Name header the extension requires (taken from `taskId`).
class GetTask(t.Request[Any, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: dict
    name_param: ClassVar[str | None] = "taskId"


class CancelTask(t.Request[Any, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: dict
    name_param: ClassVar[str | None] = "taskId"


class ListenTasks(t.Request[Any, Literal["subscriptions/listen"]]):
    """`subscriptions/listen` naming tasks (the extension's `taskIds`), which the SDK's own
    `listen()` has no argument for."""

    method: Literal["subscriptions/listen"] = "subscriptions/listen"
    params: dict


class TaskHandle(t.Result):
    """The `resultType: "task"` answer to a tools/call."""

    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    status_message: str | None = Field(default=None, alias="statusMessage")
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Args:
    url: str
    era: str
    token: str
    other_token: str
    admin: str
    approver: str
    check: str
    task_id: str | None


def http(token: str) -> httpx2.AsyncClient:
    return create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})


async def rest(args: Args, method: str, path: str, **kwargs: Any) -> Any:
    async with httpx2.AsyncClient(base_url=args.url, timeout=30) as client:
        response = await client.request(method, path, **kwargs)
        return response.status_code, response.json()


async def approve(args: Args, message: str) -> None:
    found = re.search(r"ap-[0-9a-f]+", message or "")
    require(found, f"the task's message names no approval: {message!r}")
    status, body = await rest(
        args,
        "POST",
        f"/approvals/{found.group(0)}/approve",
        headers={"Authorization": f"Bearer {args.admin}", "Ctx-Approver": args.approver},
    )
    require(status == 200, f"approving through REST: {status} {body}")


async def call_stopped_early(args: Args) -> None:
    status, body = await rest(args, "GET", "/calls?tool=deploy", headers={"Authorization": f"Bearer {args.admin}"})
    require(status == 200, f"/calls: {status} {body}")
    latest = body["calls"][0]
    require(latest["outcome"] == "cancelled", f"the call log has the deploy {latest['outcome']}: {latest}")
    require(latest["ms"] < 5000, f"the Lua run went on for {latest['ms']} ms after the cancel")


# ---- 2025-11-25 -------------------------------------------------------------------------


async def legacy_start(session: ClientSession, tool: str, arguments: dict) -> t.Task:
    raw = await session._dispatcher.send_raw_request(  # noqa: SLF001 - the SDK types leave 2025 tasks out
        "tools/call", {"name": tool, "arguments": arguments, "task": {"ttl": 600000}}, {}
    )
    return t.CreateTaskResult.model_validate(raw, by_name=False).task


async def legacy_get(session: ClientSession, task_id: str) -> t.GetTaskResult:
    return await session.send_request(t.GetTaskRequest(params=t.GetTaskRequestParams(task_id=task_id)), t.GetTaskResult)


# The statuses `notifications/tasks/status` told this session, by task id.
TOLD: dict[str, list[str]] = {}


async def on_status(params: Raw) -> None:
    told = params.model_dump()
    TOLD.setdefault(told.get("taskId", ""), []).append(told.get("status", ""))


async def legacy(args: Args) -> None:
    bindings = [NotificationBinding(method="notifications/tasks/status", params_type=Raw, handler=on_status)]
    async with streamable_http_client(f"{args.url}/mcp", http_client=http(args.token)) as (read, write):
        async with ClientSession(read, write, notification_bindings=bindings) as session:
            init = await session.initialize()
            require(init.protocol_version == "2025-11-25", f"negotiated {init.protocol_version}")
            caps = init.capabilities.model_dump(exclude_none=True)
            require("tasks" in caps, f"the server declares no tasks capability: {caps}")
            await legacy_check(args, session)


async def legacy_check(args: Args, session: ClientSession) -> None:
    if args.check == "progress":
        task = await legacy_start(session, "deploy", {"count": 6, "delay": 0.5})
        require(task.status == "working", f"a new task is {task.status}")
        messages = []
        while True:
            got = await legacy_get(session, task.task_id)
            if got.status_message and got.status_message not in messages:
                messages.append(got.status_message)
            if got.status in TERMINAL:
                break
            await anyio.sleep(max((got.poll_interval or 200) / 1000, 0.1))
        require(got.status == "completed", f"the task ended {got.status}: {got.status_message}")
        require(len([m for m in messages if m.startswith("step ")]) >= 3, f"progress seen: {messages}")
        result = await session.send_request(
            t.GetTaskPayloadRequest(params=t.GetTaskPayloadRequestParams(task_id=task.task_id)), t.CallToolResult
        )
        require(not result.is_error, f"the result is an error: {result}")
        require(result.structured_content == {"steps": 6, "padding": ""} or "steps" in str(result.content), f"{result}")
        related = (result.meta or {}).get("io.modelcontextprotocol/related-task", {})
        require(related.get("taskId") == task.task_id, f"the result names no task: {result.meta}")
        listed = await session.send_request(t.ListTasksRequest(), t.ListTasksResult)
        require(any(x.task_id == task.task_id for x in listed.tasks), "tasks/list leaves the task out")
        # The optional status notices came on the session's stream too, the end last.
        with anyio.fail_after(5):
            while "completed" not in TOLD.get(task.task_id, []):
                await anyio.sleep(0.05)
        require(TOLD[task.task_id][0] == "working", f"notices: {TOLD}")
    elif args.check == "cancel":
        task = await legacy_start(session, "deploy", {"count": 100, "delay": 0.1})
        with anyio.fail_after(10):
            while "step" not in ((await legacy_get(session, task.task_id)).status_message or ""):
                await anyio.sleep(0.1)
        cancelled = await session.send_request(
            t.CancelTaskRequest(params=t.CancelTaskRequestParams(task_id=task.task_id)), t.CancelTaskResult
        )
        require(cancelled.status == "cancelled", f"tasks/cancel answered {cancelled.status}")
        require((await legacy_get(session, task.task_id)).status == "cancelled", "tasks/get after the cancel")
        await call_stopped_early(args)
        try:
            await session.send_request(
                t.CancelTaskRequest(params=t.CancelTaskRequestParams(task_id=task.task_id)), t.CancelTaskResult
            )
            raise CheckFailed("a second cancel of an ended task was accepted")
        except MCPError as e:
            require(e.code == -32602, f"a second cancel: {e.code} {e}")
    elif args.check == "approval":
        task = await legacy_start(session, "guarded", {"count": 1, "delay": 0})
        with anyio.fail_after(10):
            while (got := await legacy_get(session, task.task_id)).status != "input_required":
                await anyio.sleep(0.1)
        await approve(args, got.status_message or "")
        result = await session.send_request(
            t.GetTaskPayloadRequest(params=t.GetTaskPayloadRequestParams(task_id=task.task_id)), t.CallToolResult
        )
        require(not result.is_error and "steps" in str(result.content), f"after approval: {result}")
        require((await legacy_get(session, task.task_id)).status == "completed", "the task did not complete")
    elif args.check == "others":
        task = await legacy_start(session, "deploy", {"count": 20, "delay": 0.1})
        async with streamable_http_client(f"{args.url}/mcp", http_client=http(args.other_token)) as (read, write):
            async with ClientSession(read, write) as other:
                await other.initialize()
                try:
                    await legacy_get(other, task.task_id)
                    raise CheckFailed("another token read the task")
                except MCPError as e:
                    require(e.code == -32602 and "no task" in str(e), f"another token: {e.code} {e}")
                listed = await other.send_request(t.ListTasksRequest(), t.ListTasksResult)
                require(not listed.tasks, f"another token lists {listed.tasks}")
        require((await legacy_get(session, task.task_id)).status == "working", "the owner's task stopped")
    elif args.check == "start":
        task = await legacy_start(session, "deploy", {"count": 600, "delay": 0.1})
        with anyio.fail_after(10):
            while "step" not in ((await legacy_get(session, task.task_id)).status_message or ""):
                await anyio.sleep(0.1)
        print(f"task: {task.task_id}", flush=True)
    elif args.check == "lost":
        got = await legacy_get(session, args.task_id or "")
        require(got.status == "failed", f"the lost task is {got.status}")
        require("ctx stopped while this task ran" in (got.status_message or ""), f"{got.status_message}")
    else:
        raise CheckFailed(f"unknown check {args.check}")


# ---- 2026-07-28 -------------------------------------------------------------------------


class TasksExtension(ClientExtension):
    """The client side of `io.modelcontextprotocol/tasks`: a `task` answer to tools/call is
    polled with `tasks/get` until it ends; `on_poll` sees every status on the way."""

    identifier = "io.modelcontextprotocol/tasks"

    def __init__(self, on_poll: Any, listen: bool = False) -> None:
        self.on_poll = on_poll
        self.listen = listen
        self.handles: list[TaskHandle] = []
        # The statuses `notifications/tasks` told, by task id.
        self.told: dict[str, list[str]] = {}

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve)]

    def notifications(self) -> list[NotificationBinding[Any]]:
        return [NotificationBinding(method="notifications/tasks", params_type=Raw, handler=self.on_notice)]

    async def on_notice(self, params: Raw) -> None:
        told = params.model_dump()
        self.told.setdefault(told.get("taskId", ""), []).append(told.get("status", ""))

    async def resolve(self, handle: TaskHandle, cx: ClaimContext) -> t.CallToolResult:
        self.handles.append(handle)
        if not self.listen:
            return await self.poll(handle, cx)
        # Also listen for the task's notices while polling, as a client that wants them does.
        async with anyio.create_task_group() as group:

            async def listen() -> None:
                request = ListenTasks(params={"notifications": {"taskIds": [handle.task_id]}})
                await cx.session.send_request(request, Raw)

            group.start_soon(listen)
            result = await self.poll(handle, cx)
            with anyio.fail_after(5):
                while "completed" not in self.told.get(handle.task_id, []):
                    await anyio.sleep(0.05)
            group.cancel_scope.cancel()
        return result

    async def poll(self, handle: TaskHandle, cx: ClaimContext) -> t.CallToolResult:
        with anyio.fail_after(RUN_TIMEOUT):
            while True:
                got = (await cx.session.send_request(GetTask(params={"taskId": handle.task_id}), Raw)).model_dump()
                await self.on_poll(cx.session, handle, got)
                if got["status"] == "completed":
                    return t.CallToolResult.model_validate(got["result"], by_name=False)
                if got["status"] in ("failed", "cancelled"):
                    text = f"task {got['status']}: {got.get('statusMessage')}"
                    return t.CallToolResult(content=[t.TextContent(type="text", text=text)], is_error=True)
                await anyio.sleep(max(got.get("pollIntervalMs", 200) / 1000, 0.1))


async def modern(args: Args) -> None:
    seen: list[dict] = []
    state: dict[str, Any] = {}

    async def on_poll(session: Any, handle: TaskHandle, got: dict) -> None:
        seen.append(got)
        if args.check == "cancel" and "step" in (got.get("statusMessage") or "") and "cancelled" not in state:
            state["cancelled"] = await session.send_request(CancelTask(params={"taskId": handle.task_id}), Raw)
        if args.check == "approval" and got["status"] == "input_required" and "approved" not in state:
            state["approved"] = True
            await approve(args, got.get("statusMessage") or "")
        if args.check == "others" and "others" not in state:
            state["others"] = True
            async with mcp.Client(
                streamable_http_client(f"{args.url}/mcp", http_client=http(args.other_token)),
                mode="auto",
                extensions=[TasksExtension(on_poll=None)],
            ) as other:
                try:
                    await other.session.send_request(GetTask(params={"taskId": handle.task_id}), Raw)
                    raise CheckFailed("another token read the task")
                except MCPError as e:
                    require(e.code == -32602 and "no task" in str(e), f"another token: {e.code} {e}")

    extension = TasksExtension(on_poll, listen=args.check == "progress")
    transport = streamable_http_client(f"{args.url}/mcp", http_client=http(args.token))
    async with mcp.Client(transport, mode="auto", extensions=[extension]) as client:
        version = client.session._negotiated_version  # noqa: SLF001
        require(version == "2026-07-28", f"negotiated {version}")
        if args.check == "progress":
            result = await client.call_tool("deploy", {"count": 6, "delay": 0.5})
            require(extension.handles, "the call answered no task handle")
            require(not result.is_error and "steps" in str(result.content), f"{result}")
            messages = {g.get("statusMessage") for g in seen if g["status"] == "working"}
            require(len([m for m in messages if m and m.startswith("step ")]) >= 3, f"progress seen: {messages}")
            require(seen[-1]["status"] == "completed", f"{seen[-1]}")
            # The notices of a listen that named the task: working first, completed last.
            told = extension.told.get(extension.handles[0].task_id, [])
            require(told and told[0] == "working" and told[-1] == "completed", f"notifications/tasks: {told}")
        elif args.check == "cancel":
            result = await client.call_tool("deploy", {"count": 100, "delay": 0.1})
            require("cancelled" in state, "no cancel was sent")
            require(result.is_error and "task cancelled" in str(result.content), f"{result}")
            await call_stopped_early(args)
        elif args.check == "approval":
            result = await client.call_tool("guarded", {"count": 1, "delay": 0})
            require(state.get("approved"), f"the task never waited for approval: {seen}")
            waiting = next(g for g in seen if g["status"] == "input_required")
            require("inputRequests" in waiting, f"an input_required task carries inputRequests: {waiting}")
            require(not result.is_error and "steps" in str(result.content), f"{result}")
        elif args.check == "others":
            result = await client.call_tool("deploy", {"count": 2, "delay": 0.2})
            require(state.get("others") and not result.is_error, f"{result}")
        elif args.check == "lost":
            got = (await client.session.send_request(GetTask(params={"taskId": args.task_id}), Raw)).model_dump()
            require(got["status"] == "failed", f"the lost task is {got['status']}")
            require("ctx stopped while this task ran" in got["error"]["message"], f"{got}")
        else:
            raise CheckFailed(f"the 2026 era has no check {args.check}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--era", choices=["2025", "2026"], required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--other-token", required=True)
    parser.add_argument("--admin", required=True)
    parser.add_argument("--approver", required=True)
    parser.add_argument("check")
    parser.add_argument("task_id", nargs="?")
    args = parser.parse_args(namespace=Args())
    run = legacy if args.era == "2025" else modern
    try:

        async def bounded() -> None:
            with anyio.fail_after(RUN_TIMEOUT):
                await run(args)

        anyio.run(bounded)
    except CheckFailed as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    print(f"ok: {args.era} {args.check}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
