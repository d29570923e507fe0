"""task_server.py: a small MCP server over stdio whose tools run only as tasks and end in the
ways server-everything's never do for ctx, for the upstream-task tests (tests/it/upstream_tasks.rs).
Raw JSON-RPC lines, standard library only, so it pins the wire shapes it answers.

    python3 task_server.py LOG     (LOG: one line per tasks/cancel received, `cancel <taskId>`)

Tools (`execution.taskSupport = "required"` unless said):
  asks    the task goes `input_required` (MCP 2025-11-25 shapes) and stays there
  fails   the task fails; `tasks/result` answers the JSON-RPC error -32000 "the work broke"
  inline  2026-07-28 shapes: `resultType: "task"`, then `tasks/get` with the result inline
  either  `optional`: a plain call answers "plain either" at once; as a task it completes and
          `tasks/result` answers "task either"
"""

import json
import sys

LOG = sys.argv[1]
tasks = {}


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def task(task_id, status, message=None):
    body = {"taskId": task_id, "status": status, "createdAt": "2026-01-01T00:00:00Z",
            "lastUpdatedAt": "2026-01-01T00:00:00Z", "ttl": 60000, "pollInterval": 100}
    if message:
        body["statusMessage"] = message
    return body


def tool(name, support="required"):
    return {"name": name, "description": name, "inputSchema": {"type": "object"},
            "execution": {"taskSupport": support}}


def answer(method, params):
    if method == "initialize":
        return {"protocolVersion": "2025-11-25", "serverInfo": {"name": "tasks", "version": "1"},
                "capabilities": {"tools": {}, "tasks": {"list": {}, "cancel": {},
                                                        "requests": {"tools": {"call": {}}}}}}
    if method == "tools/list":
        return {"tools": [tool("asks"), tool("fails"), tool("inline"), tool("either", "optional")]}
    if method == "tools/call":
        name = params["name"]
        if name == "either" and "task" not in params:
            return {"content": [{"type": "text", "text": "plain either"}]}
        task_id = "%s-%d" % (name, len(tasks) + 1)
        tasks[task_id] = name
        if name == "inline":
            return {"resultType": "task", "taskId": task_id, "status": "working",
                    "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:00Z",
                    "ttlMs": 60000, "pollIntervalMs": 100}
        if "task" not in params:
            raise ValueError("tools/call of %s without params.task" % name)
        return {"task": task(task_id, "working")}
    if method == "tasks/get":
        task_id = params["taskId"]
        name = tasks[task_id]
        if name == "asks":
            return task(task_id, "input_required", "Which topic did you mean?")
        if name == "fails":
            return task(task_id, "failed", "the work broke")
        if name == "either":
            return task(task_id, "completed", "either is done")
        return {"resultType": "complete", "taskId": task_id, "status": "completed",
                "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:00Z",
                "ttlMs": 60000, "result": {"content": [{"type": "text", "text": "inline done"}]}}
    if method == "tasks/result":
        if tasks.get(params["taskId"]) == "either":
            return {"content": [{"type": "text", "text": "task either"}]}
        raise RuntimeError("the work broke")
    if method == "tasks/cancel":
        with open(LOG, "a") as log:
            log.write("cancel %s\n" % params["taskId"])
        return task(params["taskId"], "cancelled")
    if method == "ping":
        return {}
    raise LookupError(method)


for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message or "method" not in message:
        continue
    try:
        send({"jsonrpc": "2.0", "id": message["id"],
              "result": answer(message["method"], message.get("params") or {})})
    except RuntimeError as e:
        send({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32000, "message": str(e)}})
    except Exception as e:
        send({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": repr(e)}})
