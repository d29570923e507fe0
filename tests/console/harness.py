"""What the console's browser tests stand on: a workspace made by the real `ctx init --sample`, a
real `ctx serve` on a free port, Debian's Chromium driven by Playwright, and plain HTTP calls
beside the browser (another client making calls while the console watches).

Nothing here mocks ctx: the only stand-in is the chat model (openai_stub.py).
"""

import base64
import contextlib
import json
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib

ADMIN = "admin-token-0123456789"
READER = "reader-token-0123456789"
APPROVER = "approver-token-0123456789"
CHAT_KEY = "chat-key-0123456789"

# A Lua tool that waits for a person before it runs.
DEPLOY = """
tool = {
    name = "deploy",
    description = "Deploys a service. Every call waits for a person's approval.",
    parameters = {
        { name = "service", type = "string", required = true, description = "The service to deploy" },
    },
    annotations = { read_only = false, destructive = true },
}
function tool.execute(params, context)
    return { deployed = params.service }
end
"""

# A Lua tool whose JSON Schema has a nested object, an array, an enum, defaults and required
# fields: the form the console generates for it is what the tools test fills in.
SHAPE = """
tool = {
    name = "shape",
    description = "Returns its parameters: a nested object, an array, an enum and defaults.",
    parameters = {
        type = "object",
        required = { "name", "size" },
        additionalProperties = false,
        properties = {
            name = { type = "string", minLength = 2, description = "At least two characters" },
            size = { type = "string", enum = { "small", "medium", "large" }, default = "medium" },
            count = { type = "integer", minimum = 1, maximum = 10, default = 3 },
            tags = { type = "array", items = { type = "string" }, maxItems = 3 },
            options = {
                type = "object",
                properties = {
                    verbose = { type = "boolean", default = false },
                    depth = { type = "number" },
                },
            },
        },
    },
    annotations = { read_only = true, idempotent = true },
}
function tool.execute(params, context)
    return params
end
"""


# A Lua connector with three items; once the test writes connectors/slow.delay, its syncs take
# that many seconds (long enough to watch one run) and find a fourth item.
SLOW = """
connector = { name = "slow", version = "0.1.0", description = "Three items; a fourth, slowly, once slow.delay exists." }
function connector.scan(config, context)
    local items = {}
    for i = 1, 3 do
        items[#items + 1] = { source_id = "item-" .. i, title = "Slow item " .. i, body = "Slow body " .. i, content_type = "text/plain" }
    end
    local found, delay = pcall(fs.read, "slow.delay")
    if found then
        sleep(tonumber(delay))
        items[#items + 1] = { source_id = "item-4", title = "Slow item 4", body = "Added by a later sync", content_type = "text/plain" }
    end
    return items
end
"""


def png_base64(width=4, height=4, rgb=(220, 30, 30)):
    """A small solid PNG, made here so the test needs no image file."""

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()


# A Lua tool that answers with MCP content blocks: a text, an image and a resource.
PICTURE = (
    """
tool = {
    name = "picture",
    description = "Answers with MCP content blocks: a text, an image and a resource. <b onmouseover=alert(1)>Markup</b> stays text.",
    annotations = { read_only = true },
}
function tool.execute(params, context)
    return MCP.content({
        { type = "text", text = "a red square" },
        { type = "image", data = "%s", mimeType = "image/png" },
        { type = "resource", resource = { uri = "file:///notes/red.txt", mimeType = "text/plain", text = "notes about red" } },
    })
end
"""
    % png_base64()
)


def ctx_bin():
    path = os.environ.get("CTX_BIN")
    if not path:
        raise SystemExit("CTX_BIN is not set: the path of the ctx binary under test")
    return path


class Workspace:
    """`ctx init --sample` in a temporary folder, with the console tests' tools and settings."""

    def __init__(self, *, auth=True, chat_url=None, upstream_fails=False, upstream_time=False, extra=""):
        self.dir = tempfile.mkdtemp(prefix="ctx-console-")
        self.run("init", "--sample", ".", config=False)
        config_path = os.path.join(self.dir, "ctx.toml")
        with open(config_path) as f:
            config = f.read()
        if auth:
            # The sample's [server] has the token commented out; this server needs one.
            config = config.replace('# auth_token = "${CTX_TOKEN}"', 'auth_token = "${CONSOLE_ADMIN_TOKEN}"', 1)
            assert "CONSOLE_ADMIN_TOKEN" in config, "the sample ctx.toml changed: no auth_token line to set"
        for name, text in (("deploy", DEPLOY), ("shape", SHAPE), ("picture", PICTURE)):
            with open(os.path.join(self.dir, "tools", f"{name}.lua"), "w") as f:
                f.write(text)
        self.write("connectors/slow.lua", SLOW)
        config += """
[tools.script.deploy]
path = "tools/deploy.lua"
approve = true

[tools.script.shape]
path = "tools/shape.lua"

[tools.script.picture]
path = "tools/picture.lua"

[approval]
approver_token = "${CONSOLE_APPROVER_TOKEN}"

[connectors.script.slow]
path = "connectors/slow.lua"
"""
        if auth:
            config += """
[[server.tokens]]
name = "reader"
token = "${CONSOLE_READER_TOKEN}"
tools = ["search", "get", "sources", "echo"]
"""
        if upstream_fails:
            # A stdio server whose command exits at once: ctx keeps restarting it.
            config += """
[mcp.servers.broken]
command = "/bin/false"
"""
        if upstream_time:
            # A real upstream MCP server (mcp-server-time, from scripts/test-env): its tools are
            # time__get_current_time and time__convert_time.
            command = os.environ.get("CTX_TEST_TIME_SERVER")
            assert command, "CTX_TEST_TIME_SERVER is not set: eval \"$(scripts/test-env)\" names it"
            config += f"""
[mcp.servers.time]
command = {json.dumps(command)}
"""
        if chat_url:
            config += f"""
[chat]
provider = "openai"
model = "stub-model"
url = "{chat_url}"
api_key = "${{CONSOLE_CHAT_KEY}}"
"""
        config += extra
        with open(config_path, "w") as f:
            f.write(config)
        self.run("sync")

    def env(self):
        env = dict(os.environ)
        env.update(
            CONSOLE_ADMIN_TOKEN=ADMIN,
            CONSOLE_READER_TOKEN=READER,
            CONSOLE_APPROVER_TOKEN=APPROVER,
            CONSOLE_CHAT_KEY=CHAT_KEY,
            CTX_MODEL_DIR="/nonexistent/ctx-test-model",
        )
        # CTX_CONSOLE_DIR passes through: in a debug build it serves console/ from disk while editing.
        for name in ("CTX_CONFIG", "CTX_LOG"):
            env.pop(name, None)
        return env

    def run(self, *args, config=True):
        argv = [ctx_bin()] + (["--config", "ctx.toml"] if config else []) + list(args)
        done = subprocess.run(argv, cwd=self.dir, env=self.env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def write(self, rel, text):
        path = os.path.join(self.dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class Server:
    """`ctx serve --bind 127.0.0.1:0` in a workspace; its address from its first stdout line."""

    def __init__(self, ws):
        self.ws = ws
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [ctx_bin(), "--config", "ctx.toml", "serve", "--bind", "127.0.0.1:0"],
            cwd=ws.dir,
            env=ws.env(),
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        first = self.proc.stdout.readline()
        address = next((w for w in first.split() if w.startswith("http://")), None)
        if not address:
            self.stop()
            self.log.seek(0)
            raise AssertionError(f"ctx serve printed no address: {first!r}\n{self.log.read()}")
        self.base = address.rstrip("/")
        # The rest of stdout is drained so the server never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def request(self, method, path, body=None, token=ADMIN, headers=None):
        """A plain HTTP request: (status, parsed JSON or text, headers)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=30) as answer:
                status, raw, hdrs = answer.status, answer.read(), answer.headers
        except urllib.error.HTTPError as err:
            status, raw, hdrs = err.code, err.read(), err.headers
        text = raw.decode("utf-8", "replace")
        try:
            return status, json.loads(text), hdrs
        except ValueError:
            return status, text, hdrs


@contextlib.contextmanager
def served(**options):
    ws = Workspace(**options)
    server = Server(ws)
    try:
        yield server
    finally:
        server.stop()
        ws.remove()


@contextlib.contextmanager
def browser():
    from playwright.sync_api import sync_playwright

    executable = os.environ.get("CTX_TEST_CHROMIUM")
    if not executable:
        raise SystemExit("CTX_TEST_CHROMIUM is not set: eval \"$(scripts/test-env)\" installs and names Chromium")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield chromium
        finally:
            chromium.close()


class Console:
    """One browser tab on the console: logs in, goes places, and fails on a script error."""

    def __init__(self, chromium, server, *, token=ADMIN, login=True, **context_options):
        self.server = server
        self.context = chromium.new_context(**context_options)
        self.context.set_default_timeout(10_000)
        self.page = self.context.new_page()
        self.errors = []
        self.page.on("pageerror", lambda err: self.errors.append(str(err)))
        if login:
            self.login(token)

    def login(self, token):
        page = self.page
        page.goto(self.server.base + "/console/")
        assert page.url.endswith("/console/login"), f"without a token /console/ should lead to the login page, got {page.url}"
        page.fill("#token", token)
        page.press("#token", "Enter")
        page.wait_for_url("**/console/")
        self.wait_ready()

    def wait_ready(self):
        self.page.wait_for_selector("html[data-ready=true]")

    def go(self, route):
        """Follows a route by its hash (as a link in the page would)."""
        self.page.evaluate("route => { location.hash = route }", route)

    def check(self):
        assert not self.errors, f"the page had script errors: {self.errors}"

    def close(self):
        self.check()
        self.context.close()


def wait_until(predicate, timeout=10.0, message="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {message}")
