"""The console in a real browser against a real `ctx serve`: one scenario per area.

    CTX_BIN=target/debug/ctx CTX_TEST_CHROMIUM=/usr/lib/chromium/chromium \
        python tests/console/console_test.py search [tools ...]

tests/it/console.rs runs each scenario as its own test. A scenario prints "ok: <what it saw>"
lines, and exits non-zero (with the page's screenshot path) when something is not as it should be.
"""

import json
import os
import re
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import ADMIN, APPROVER, CHAT_KEY, READER, Console, browser, served, wait_until  # noqa: E402
from openai_stub import Stub, tool_call  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

# CI runs these beside the rest of the suite on two cores: waits are generous, and a pass is fast.
expect.set_options(timeout=10_000)

CONSOLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "console")
SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def say(text):
    print(f"ok: {text}", flush=True)


@scenario
def search(chromium, server):
    """Search with mode, source and date filters; open a result's whole document and its chunks."""
    c = Console(chromium, server)
    page = c.page
    page.fill("input[name=query]", "rollback")
    page.select_option("select[name=mode]", "keyword")
    page.select_option("select[name=source]", "filesystem:docs")
    page.fill("input[name=since]", "2000-01-01")
    page.press("input[name=query]", "Enter")
    hits = page.locator(".hit")
    expect(hits.first).to_be_visible()
    count = hits.count()
    assert count >= 1
    first = hits.first
    title = first.locator("h3 a").inner_text()
    expect(first.locator(".meta")).to_contain_text("filesystem:docs")
    expect(first.locator(".path")).to_have_text(re.compile(r"\.md$"))
    expect(first.locator(".snippet mark").first).to_be_visible()
    # The same request over plain HTTP gives the same first hit: the page shows the API's answer.
    status, body, _ = server.request("POST", "/tools/search", {"query": "rollback", "source": "filesystem:docs", "since": "2000-01-01"})
    assert status == 200 and body["results"][0]["title"] == title, (status, body)
    say(f"search 'rollback' in filesystem:docs since 2000-01-01: {count} hits, first '{title}' with its path and highlighted snippet")

    # A date in the future leaves nothing.
    page.fill("input[name=since]", "2999-01-01")
    page.click("button:has-text('Search')")
    expect(page.locator("#result-count")).to_have_text(re.compile(r"^0 results"))
    page.fill("input[name=since]", "")
    page.press("input[name=query]", "Enter")
    expect(page.locator(".hit").first).to_be_visible()
    say("a since date after every document leaves 0 results")

    page.locator(".hit h3 a").first.click()
    expect(page.locator("article.document h1")).to_have_text(title)
    chunks = page.locator(".chunk")
    expect(chunks.first).to_be_visible()
    doc_id = page.evaluate("decodeURIComponent(location.hash.split('/')[2])")
    status, doc, _ = server.request("POST", "/tools/get", {"id": doc_id})
    assert status == 200
    assert chunks.count() == len(doc["chunks"]), (chunks.count(), len(doc["chunks"]))
    expect(chunks.first.locator("pre")).to_have_text(doc["chunks"][0]["text"])
    say(f"the result opens the whole document '{title}' with its {len(doc['chunks'])} chunk(s), as POST /tools/get gives them")

    page.click("text=Back to the results")
    expect(page.locator(".hit").first).to_be_visible()
    say("back to the results keeps them")

    # A new tab has the cookie but no token in its sessionStorage: the first API call's 401
    # sends it to the login page.
    tab = c.context.new_page()
    tab.goto(server.base + "/console/#/search")
    tab.wait_for_url("**/console/login")
    tab.close()
    say("a new tab without the token in sessionStorage goes to /console/login")

    # Log out: the cookie goes, so the console's files are closed again.
    page.click("#logout")
    page.wait_for_url("**/console/login")
    assert page.evaluate("sessionStorage.length") == 0
    status = page.evaluate("fetch('/console/app.js').then(r => r.status)")
    assert status == 401, status
    say("log out clears sessionStorage and the cookie: /console/app.js answers 401 again")
    c.close()


@scenario
def tools(chromium, server):
    """A tool's generated form: nested object, array, enum, defaults; validation at the field."""
    c = Console(chromium, server)
    page = c.page
    # The upstream server's tools are listed once it is connected.
    wait_until(lambda: any(t["name"] == "time__get_current_time" for t in server.request("GET", "/tools/list")[1]["tools"]), 20, "the time server's tools")
    c.go("#/tools")
    lists = page.locator(".tool-list")
    for name in ("search", "get", "sources", "execute", "echo", "deploy", "shape", "picture"):
        expect(lists.locator(f"a[data-tool='{name}']")).to_be_visible()
    expect(lists).to_contain_text("Built-in")
    expect(lists).to_contain_text("Lua")
    expect(lists).to_contain_text("Upstream (MCP)")
    expect(lists.locator("a[data-tool='time__get_current_time']")).to_be_visible()
    expect(lists).to_contain_text("Scripted (code mode)")
    expect(lists.locator("a[data-tool='triage']")).to_be_visible()
    say("the list shows built-in, Lua, scripted and upstream (server__tool) tools by kind")

    # An upstream tool: its form from the server's schema, its result, its output schema.
    c.go("#/tools/time__get_current_time")
    tool = page.locator("article.tool[data-tool='time__get_current_time']")
    expect(tool.locator(".badges")).to_contain_text("Upstream (MCP)")
    tool.locator(".field[data-path='/timezone'] input").fill("UTC")
    tool.locator(".field[data-path='/timezone'] input").press("Enter")
    expect(tool.locator(".output .result")).to_contain_text('"timezone": "UTC"')
    expect(tool.locator("details.output-schema")).to_be_attached()
    say("the upstream tool time__get_current_time runs from its form: {timezone: UTC, …}")

    c.go("#/tools/deploy")
    tool = page.locator("article.tool[data-tool='deploy']")
    expect(tool.locator(".badges")).to_contain_text("destructive")
    c.go("#/tools/shape")
    tool = page.locator("article.tool[data-tool='shape']")
    expect(tool.locator(".badges")).to_contain_text("read-only")
    expect(tool.locator(".description")).to_have_text("Returns its parameters: a nested object, an array, an enum and defaults.")
    say("annotations show: deploy is destructive, shape read-only")

    form = tool.locator("form.schema-form")
    # Defaults are filled in: size (enum) is medium, count is 3.
    size = form.locator(".field[data-path='/size'] select")
    expect(size.locator("option:checked")).to_have_text("medium")
    expect(form.locator(".field[data-path='/count'] input")).to_have_value("3")
    expect(form.locator(".field[data-path='/name'] .required")).to_be_visible()
    # Invalid on purpose: a one-letter name, four tags where three are allowed.
    form.locator(".field[data-path='/name'] input").fill("x")
    add = form.locator("button:has-text('Add tags item')")
    for i in range(4):
        add.click()
        form.locator(f".field[data-path='/tags/{i}'] input").fill(f"t{i}")
    form.locator(".field[data-path='/options/depth'] input").fill("2.5")
    form.locator("button[type=submit]").click()
    name_error = form.locator(".field[data-path='/name'] .field-error")
    expect(name_error).to_be_visible()
    status, body, _ = server.request("POST", "/tools/shape", {"name": "x", "size": "medium", "count": 3, "tags": ["t0", "t1", "t2", "t3"], "options": {"verbose": False, "depth": 2.5}})
    assert status == 400, (status, body)
    by_path = {d["path"]: d["message"] for d in body["error"]["details"]}
    expect(name_error).to_have_text(by_path["/name"])
    expect(form.locator("fieldset[data-path='/tags'] > .field-error")).to_have_text(by_path["/tags"])
    expect(form.locator(".field[data-path='/name'] input")).to_have_attribute("aria-invalid", "true")
    expect(tool.locator(".output .error")).to_contain_text(body["error"]["message"])
    say(f"the server's 400 details show at their fields: /name '{by_path['/name']}', /tags '{by_path['/tags']}'")

    form.locator(".field[data-path='/name'] input").fill("xy")
    form.locator("button[aria-label='Remove tags item 4']").click()
    size.select_option("large")
    form.locator(".field[data-path='/name'] input").press("Enter")
    result = tool.locator(".output .result pre.json")
    expect(result).to_be_visible()
    got = json.loads(result.inner_text())
    assert got == {"name": "xy", "size": "large", "count": 3, "tags": ["t0", "t1", "t2"], "options": {"verbose": False, "depth": 2.5}}, got
    expect(form.locator(".field-error")).to_have_count(0)
    say(f"fixed and sent with Enter, the call returns {json.dumps(got)}")

    # MCP content blocks: the text and the image render as such.
    c.go("#/tools/picture")
    tool = page.locator("article.tool[data-tool='picture']")
    expect(tool).to_contain_text("This tool takes no parameters.")
    # Server text is text: markup in a description is shown, never parsed.
    expect(tool.locator(".description")).to_contain_text("<b onmouseover=alert(1)>Markup</b> stays text.")
    expect(tool.locator(".description b")).to_have_count(0)
    tool.locator("button[type=submit]").click()
    image = tool.locator(".blocks img")
    expect(image).to_be_visible()
    expect(tool.locator(".blocks .block.text")).to_have_text("a red square")
    assert image.evaluate("img => img.complete && img.naturalWidth") == 4
    resource = tool.locator(".blocks .block.resource")
    expect(resource).to_contain_text("file:///notes/red.txt")
    expect(resource.locator("pre")).to_have_text("notes about red")
    say("MCP content blocks render: the text, the image (4 px wide, from a data: URL) and the resource with its URI")

    # Code mode: a script typed in the editor (Tab indents), its result and the trace.
    c.go("#/tools/execute")
    tool = page.locator("article.tool[data-tool='execute']")
    editor = tool.locator("textarea.code")
    editor.click()
    page.keyboard.type("local a = ctx.search({query = \"deploy\", limit = 1})\nlocal b = ctx.echo({message = \"hi\"})\nif true then\n")
    page.keyboard.press("Tab")
    page.keyboard.type("return {hits = #a:await().results, echo = b:await().message}\nend")
    assert "\n  return {hits" in editor.input_value(), editor.input_value()
    tool.locator("button:has-text('Run script')").click()
    result = tool.locator(".output .result pre.json")
    expect(result).to_be_visible()
    assert json.loads(result.inner_text()) == {"hits": 1, "echo": "hi"}, result.inner_text()
    rows = tool.locator(".trace tbody tr")
    expect(rows).to_have_count(2)
    tools_called = sorted(rows.nth(i).locator("td").nth(1).inner_text() for i in range(2))
    assert tools_called == ["echo", "search"], tools_called
    say("code mode: Tab indents in the editor; the script's result and its trace (search, echo) show")

    # A script that fails shows the server's words and the line.
    editor.fill("local x = 1\nreturn ctx.nope()")
    tool.locator("button:has-text('Run script')").click()
    expect(tool.locator(".output .error")).to_contain_text('ctx has no tool "nope"')
    expect(tool.locator(".output")).to_contain_text("script line 2")
    say("a failing script shows the server's message and its line")

    # A scripted tool gets the same editor; its script sees only its tools.
    c.go("#/tools/triage")
    tool = page.locator("article.tool[data-tool='triage']")
    tool.locator("textarea.code").fill('return ctx.search({query = "deploy", limit = 1}):await().results[1].title')
    tool.locator("button:has-text('Run script')").click()
    expect(tool.locator(".output .result pre.text")).to_have_text("Deploy runbook")
    expect(tool.locator(".trace tbody tr")).to_have_count(1)
    say("the scripted tool triage runs a script in the same editor: 'Deploy runbook', one traced call")
    c.close()


@scenario
def approvals(chromium, server):
    """A call that needs approval waits in the console, is approved there, then runs; one is denied."""
    c = Console(chromium, server)
    page = c.page
    c.go("#/tools/deploy")
    tool = page.locator("article.tool[data-tool='deploy']")
    tool.locator(".field[data-path='/service'] input").fill("payments")
    tool.locator(".field[data-path='/service'] input").press("Enter")
    wait = tool.locator(".approval-wait")
    expect(wait).to_contain_text("Waiting for approval ap-")
    approval_id = wait.get_attribute("data-approval")
    say(f"calling deploy answers 202: the tool page waits for approval {approval_id}")

    c.go("#/approvals")
    card = page.locator(f"article.approval[data-approval='{approval_id}']")
    expect(card).to_be_visible()
    expect(card).to_contain_text("deploy")
    expect(card.locator("pre.json")).to_contain_text('"service": "payments"')
    expect(card.locator(".caller")).to_contain_text("unscoped")
    expect(card).to_contain_text("Expires")
    # Without the approver token the server refuses, and the page says why in its words.
    card.locator("button:has-text('Approve')").click()
    status, body, _ = server.request("POST", f"/approvals/{approval_id}/approve")
    assert status in (401, 403), (status, body)
    expect(card.locator(".error")).to_contain_text(body["error"]["message"])
    say(f"approving without the approver token shows the server's refusal: {body['error']['message'][:60]}…")

    page.fill("#approver-token", APPROVER)
    page.press("#approver-token", "Enter")
    assert page.evaluate("sessionStorage.getItem('ctx-approver')") == APPROVER
    card.locator("button:has-text('Approve')").click()
    expect(card).to_have_count(0)
    decided = page.locator(f".decided-item[data-approval='{approval_id}']")
    expect(decided).to_be_visible()
    say("with the approver token (kept in sessionStorage) the approval goes from waiting to decided")

    c.go("#/tools/deploy")
    result = page.locator("article.tool[data-tool='deploy'] .output .result pre.json")
    expect(result).to_be_visible()
    assert json.loads(result.inner_text()) == {"deployed": "payments"}, result.inner_text()
    c.go("#/approvals")
    expect(page.locator(f".decided-item[data-approval='{approval_id}']")).to_have_attribute("data-state", "used")
    say("the waiting call ran once approved: {'deployed': 'payments'}, and its approval is 'used'")

    # Another client's call appears without a reload, and is denied with a reason.
    page.evaluate("window.sameDocument = true")
    status, other, _ = server.request("POST", "/tools/deploy", {"service": "database"})
    assert status == 202, (status, other)
    card = page.locator(f"article.approval[data-approval='{other['id']}']")
    expect(card).to_be_visible(timeout=10_000)
    assert page.evaluate("window.sameDocument") is True
    card.locator("input[name=reason]").fill("not on a Friday")
    card.locator("input[name=reason]").press("Enter")
    denied = page.locator(f".decided-item[data-approval='{other['id']}']")
    expect(denied).to_have_attribute("data-state", "denied")
    expect(denied.locator(".reason")).to_contain_text("not on a Friday")
    status, body, _ = server.request("POST", "/tools/deploy", {"service": "database"}, headers={"Ctx-Approval": other["token"]})
    assert status == 403 and body["error"]["code"] == "approval_refused", (status, body)
    say("another client's pending call appeared by itself (poll), was denied with a reason, and its call is refused")
    c.close()


@scenario
def activity(chromium, server):
    """The live call log, its filters and entries; a failing upstream; charts from the metrics."""
    c = Console(chromium, server)
    page = c.page
    server.request("POST", "/tools/echo", {"message": "before"})
    server.request("POST", "/tools/execute", {"script": 'return ctx.echo({message = "inner"}):await()'})
    server.request("POST", "/tools/shape", {"name": "x"})
    c.go("#/activity")
    calls = page.locator("ol.calls > li")
    expect(page.locator("ol.calls > li[data-tool='execute']")).to_have_count(1)
    page.evaluate("window.sameDocument = true")
    before = calls.count()

    # A call made by another client shows up without a reload.
    server.request("POST", "/tools/echo", {"message": "live"})
    expect(calls).to_have_count(before + 1, timeout=10_000)
    newest = calls.first
    expect(newest).to_have_attribute("data-tool", "echo")
    assert page.evaluate("window.sameDocument") is True
    # A few polls later it is still there once: entries are kept by seq.
    time.sleep(2.5)
    expect(calls).to_have_count(before + 1)
    say(f"a new call appeared on top without a reload ({before} → {before + 1} entries), and only once")

    newest.locator("summary").click()
    body = newest.locator(".call-body")
    expect(body).to_contain_text('"message": "live"')
    expect(body).to_contain_text("Duration")
    # The script's entry lists its inner call.
    script = page.locator("ol.calls > li[data-tool='execute']")
    script.locator("summary").click()
    expect(script.locator(".inner li")).to_have_count(1)
    expect(script.locator(".inner li")).to_contain_text("echo")
    say("an entry opens on its parameters, result and duration; the script's entry lists its inner echo call")

    # Filters: errors only, then by tool.
    page.select_option("#f-outcome", "true")
    expect(page.locator("ol.calls > li[data-tool='shape']")).to_have_count(1)
    expect(page.locator("ol.calls > li[data-outcome='ok']")).to_have_count(0)
    page.select_option("#f-outcome", "")
    page.fill("#f-tool", "echo")
    page.press("#f-tool", "Enter")
    expect(page.locator("ol.calls > li[data-tool='execute']")).to_have_count(0)
    expect(page.locator("ol.calls > li[data-tool='echo']").first).to_be_visible()
    say("filters: errors only shows the failed shape call; tool=echo only echo's")

    row = page.locator("article.upstream[data-upstream='broken']")
    expect(row).to_be_visible()
    expect(row.locator(".last-error")).not_to_be_empty(timeout=15_000)
    state = row.get_attribute("data-state")
    assert state in ("restarting", "crash-looping", "connecting"), state
    say(f"the failing upstream 'broken' shows as {state}: {row.locator('.last-error').inner_text()[:70]}")

    charts = page.locator(".charts")
    expect(charts.locator("svg.chart")).to_have_count(3)
    expect(charts.locator("svg.chart").nth(2)).to_contain_text("p99")
    say("three SVG charts: calls per minute, calls per tool, latency percentiles from the histogram")
    c.close()


@scenario
def scoped(chromium, server):
    """A scoped token sees only its tools, and no approvals, metrics or upstreams."""
    c = Console(chromium, server, token=READER)
    page = c.page
    expect(page.locator("#nav a[data-route='approvals']")).to_be_hidden()
    c.go("#/tools")
    expect(page.locator(".tool-list a")).to_have_count(4)
    names = sorted(page.locator(".tool-list a").evaluate_all("links => links.map(a => a.dataset.tool)"))
    assert names == ["echo", "get", "search", "sources"], names
    say(f"the reader token's tool list is exactly {names}")
    c.go("#/tools/deploy")
    expect(page.locator(".tool-detail .error")).to_contain_text('no tool named "deploy"')
    c.go("#/approvals")
    expect(page.locator(".view-approvals .notice")).to_contain_text("scoped")
    say("the Approvals link is hidden, and its page explains that the token is scoped")
    c.go("#/activity")
    expect(page.locator(".charts .notice")).to_contain_text("this token cannot read them")
    expect(page.locator(".upstreams")).to_contain_text("does not see the upstream servers")
    expect(page.locator(".charts svg.chart")).to_have_count(1)
    say("Activity explains the 403 on metrics and shows no upstreams")
    c.close()


@scenario
def sync(chromium, server):
    """A sync started from the Sources page runs, shows progress, and finishes with new counts."""
    c = Console(chromium, server)
    page = c.page
    server.ws.write("docs/new-page.md", "# Freshly added\n\nA page written after the first sync.\n")
    c.go("#/sources")
    card = page.locator("article.source[data-source='filesystem:docs']")
    expect(card.locator(".documents")).to_have_text("6")
    card.locator("button:has-text('Sync now')").click()
    job = card.locator(".job")
    expect(job).to_have_attribute("data-state", "done", timeout=20000)
    expect(job.locator(".summary")).to_contain_text("1 added")
    expect(card.locator(".documents")).to_have_text("7")
    expect(card.locator(".took")).not_to_have_text("–")
    status, jobs, _ = server.request("GET", "/sources/sync")
    assert status == 200 and jobs["jobs"][0]["state"] == "done", (status, jobs)
    say(f"sync of filesystem:docs from the page: done, 1 added, 6 → 7 documents, took {card.locator('.took').inner_text()}")

    # A sync that takes three seconds: the page shows it running, with a progress bar, then done.
    card = page.locator("article.source[data-source='script:slow']")
    expect(card.locator(".documents")).to_have_text("3")
    server.ws.write("connectors/slow.delay", "3")
    card.locator("input[name=full]").check()
    card.locator("button[type=submit]").click()
    job = card.locator(".job")
    expect(job).to_have_attribute("data-state", "running")
    expect(job.locator("progress")).to_be_visible()
    # The source held 3 items: that is the estimate the bar measures against.
    expect(job.locator("progress")).to_have_attribute("max", "3")
    expect(job).to_contain_text("of 3 items seen")
    expect(card.locator("button[type=submit]")).to_be_disabled()
    # Starting it again while it runs: the server's 409, in its words.
    status, body, _ = server.request("POST", "/sources/script%3Aslow/sync")
    assert status == 409, (status, body)
    expect(job).to_have_attribute("data-state", "done", timeout=20000)
    expect(job.locator(".summary")).to_contain_text("1 added")
    expect(card.locator(".documents")).to_have_text("4")
    say("a 3 s sync of script:slow (full): running with a progress bar out of its estimate (3) and the button disabled (a second start is 409), then done, 3 → 4 documents")

    # A sync another client starts shows up on the page by itself.
    status, body, _ = server.request("POST", "/sources/filesystem%3Adocs/sync")
    assert status == 202, (status, body)
    docs = page.locator("article.source[data-source='filesystem:docs'] .job .summary")
    expect(docs).to_contain_text("7 unchanged", timeout=15_000)
    say("a sync started by another client appears on the page without a reload")

    # A scoped token may not start syncs: the page says so instead of offering the button.
    c.close()
    c = Console(chromium, server, token=READER)
    c.go("#/sources")
    card = c.page.locator("article.source[data-source='filesystem:docs']")
    expect(card).to_contain_text("Syncing needs server.auth_token")
    expect(card.locator("button:has-text('Sync now')")).to_have_count(0)
    say("a scoped token sees the sources but no sync button, with the reason")
    c.close()


def chat_reply(body):
    """The stub model: asks for four tool calls, then answers with what came back."""
    last = body["messages"][-1]
    first = body["messages"][0]
    if first["role"] == "system" and "how this team works" in (first["content"] or ""):
        # Opened by the runbook-guide agent: answer from the documents it loaded.
        titles = re.findall(r"^Document: (.+?) \(", "\n".join(m["content"] or "" for m in body["messages"]), re.M)
        return {"content": f"From the runbooks ({', '.join(titles)}): roll back with shipit."}
    if last["role"] == "user" and last["content"] == "break":
        return {"_status": 500, "_body": {"error": {"message": "the model is overloaded", "type": "server_error"}}}
    if last["role"] == "user":
        return {
            "content": None,
            "tool_calls": [
                tool_call("call_echo", "echo", {"message": "hello from the model"}),
                tool_call("call_deploy", "deploy", {"service": "payments"}),
                tool_call("call_deploy_db", "deploy", {"service": "database"}),
                tool_call("call_shape", "shape", {"name": "x"}),
            ],
        }
    return {"content": "All done: echo answered, payments deployed, database refused, shape refused its name."}


@scenario
def chat(chromium, server, stub):
    """Chat through the stub model: tool calls that run, wait for approval (approved, denied), fail."""
    c = Console(chromium, server)
    page = c.page
    c.go("#/chat")
    expect(page.locator(".view-chat .model")).to_contain_text("stub-model")
    page.fill("#chat-input", "Deploy payments please")
    page.press("#chat-input", "Enter")
    log = page.locator("ol.conversation")
    expect(log.locator(".msg.user")).to_have_text(re.compile("Deploy payments please"))
    echo = log.locator(".tool-call[data-call='call_echo']")
    expect(echo.locator(".outcome .result")).to_contain_text("hello from the model")
    expect(echo.locator("pre.json").first).to_contain_text('"message": "hello from the model"')
    deploy = log.locator(".tool-call[data-call='call_deploy']")
    wait = deploy.locator(".approval-wait")
    expect(wait).to_contain_text("Waiting for approval ap-")
    approval_id = wait.get_attribute("data-approval")
    expect(page.locator(".chat-status")).to_contain_text(f"Waiting for approval {approval_id}")
    say(f"the model's echo call ran and shows its result; its deploy call waits for approval {approval_id}")

    c.go("#/approvals")
    page.fill("#approver-token", APPROVER)
    page.press("#approver-token", "Enter")
    page.locator(f"article.approval[data-approval='{approval_id}'] button:has-text('Approve')").click()
    # The conversation went on by itself: the next call (deploy database) now waits here too.
    card = page.locator("article.approval").filter(has_text="database")
    expect(card).to_be_visible(timeout=15_000)
    card.locator("input[name=reason]").fill("the database stays")
    card.locator("button:has-text('Deny')").click()
    expect(card).to_have_count(0)
    c.go("#/chat")
    expect(deploy.locator(".outcome .result")).to_contain_text('"deployed": "payments"', timeout=15_000)
    denied = log.locator(".tool-call[data-call='call_deploy_db'] .outcome .error")
    expect(denied).to_contain_text("the database stays")
    shape = log.locator(".tool-call[data-call='call_shape']")
    expect(shape.locator(".outcome .error")).to_contain_text("invalid parameters for tool 'shape'")
    expect(log.locator(".msg.assistant").last).to_contain_text("All done")
    say("approved in the console, deploy payments ran; deploy database was denied with its reason; shape's failure shows; the model answered 'All done…'")

    requests = stub.chat_requests()
    assert len(requests) == 2, [r["body"] for r in requests]
    first, second = requests
    assert first["headers"].get("authorization") == f"Bearer {CHAT_KEY}", first["headers"]
    sent_tools = sorted(t["function"]["name"] for t in first["body"].get("tools", []))
    status, listed, _ = server.request("GET", "/tools/list")
    expected = sorted(re.sub(r"[^A-Za-z0-9_-]", "_", t["name"]) for t in listed["tools"])
    assert sent_tools == expected, (sent_tools, expected)
    say(f"ctx sent the key as Authorization and the token's {len(sent_tools)} tools to the model")

    results = {m.get("tool_call_id"): m.get("content") for m in second["body"]["messages"] if m.get("role") == "tool"}
    assert set(results) == {"call_echo", "call_deploy", "call_deploy_db", "call_shape"}, results
    assert "hello from the model" in results["call_echo"], results
    assert "payments" in results["call_deploy"] and "deployed" in results["call_deploy"], results
    assert "approval_refused" in results["call_deploy_db"] and "the database stays" in results["call_deploy_db"], results
    assert "bad_request" in results["call_shape"] and "/name" in results["call_shape"], results
    say("the follow-up carried the four tool results: echo's, deploy's after approval, the denial's words, shape's error")

    # The model's API failing: ctx's 502 in its words, and a way to try again.
    page.click("button:has-text('New conversation')")
    page.fill("#chat-input", "break")
    page.press("#chat-input", "Enter")
    failed = log.locator(".msg.failed")
    expect(failed.locator(".error")).to_contain_text("overloaded")
    expect(failed.locator("button:has-text('Try again')")).to_be_visible()
    say(f"a failing model shows ctx's 502 with the model's words: {failed.locator('.error').inner_text()[:80]}")

    # An agent opens a conversation: its system prompt and documents seed it, and the model
    # answers the question it ends with.
    agents = page.locator("details.agents")
    if not agents.evaluate("d => d.open"):
        agents.locator("summary").click()
    page.select_option("#agent-select", "runbook-guide")
    page.locator("input[data-arg='question']").fill("how do I roll back a deploy")
    page.click("button:has-text('Start conversation')")
    expect(log.locator(".msg.system")).to_have_count(1)
    expect(log.locator(".msg.assistant").last).to_contain_text("From the runbooks (")
    status, prompt, _ = server.request("POST", "/agents/runbook-guide/prompt", {"question": "how do I roll back a deploy"})
    sent = stub.chat_requests()[-1]["body"]["messages"]
    assert sent[0] == {"role": "system", "content": prompt["system"]}, sent[0]
    assert [m["content"] for m in sent[1:]] == [m["content"] for m in prompt["messages"]], sent
    say(f"the runbook-guide agent seeded the conversation ({len(prompt['messages'])} messages after its system prompt) and the model answered")
    c.close()


@scenario
def chat_scoped(chromium, server, stub):
    """The model is offered exactly the scoped token's tools."""
    c = Console(chromium, server, token=READER)
    c.go("#/chat")
    c.page.fill("#chat-input", "hello")
    c.page.press("#chat-input", "Enter")
    expect(c.page.locator(".tool-call[data-tool='echo'] .outcome .result")).to_be_visible()
    expect(c.page.locator(".tool-call[data-call='call_deploy'] .outcome .error")).to_contain_text("unknown tool 'deploy'")
    requests = stub.chat_requests()
    sent = sorted(t["function"]["name"] for t in requests[0]["body"].get("tools", []))
    assert sent == ["echo", "get", "search", "sources"], sent
    say(f"a scoped token's chat offers the model {sent} only; its call of deploy is refused as unknown")
    c.close()


@scenario
def chat_disabled(chromium, server):
    """Without [chat], the Chat page says how to turn it on."""
    c = Console(chromium, server)
    c.go("#/chat")
    notice = c.page.locator(".chat-disabled")
    expect(notice).to_contain_text("Chat is off")
    status, body, _ = server.request("GET", "/chat")
    assert status == 200 and body["enabled"] is False, (status, body)
    expect(notice.locator("pre")).to_have_text(body["hint"])
    expect(notice).to_contain_text("[chat]")
    say("chat disabled: the page shows the server's hint with a [chat] example")
    c.close()


@scenario
def no_token(chromium, server):
    """A server with no token configured: the console opens without a login and sends none."""
    c = Console(chromium, server, login=False)
    page = c.page
    sent = []
    page.on("request", lambda r: sent.append(r.headers.get("authorization")) if "/tools/" in r.url else None)
    page.goto(server.base + "/console/")
    c.wait_ready()
    assert page.url == server.base + "/console/", page.url
    c.go("#/tools/echo")
    page.locator(".field[data-path='/message'] input").fill("open")
    page.locator(".field[data-path='/message'] input").press("Enter")
    expect(page.locator("article.tool[data-tool='echo'] .result")).to_contain_text('"message": "open"')
    assert sent and all(a is None for a in sent), sent
    say(f"no token configured: /console/ opens directly, and its {len(sent)} API calls carry no Authorization header")
    c.close()


def luminance(css_color):
    r, g, b = (int(x) for x in re.findall(r"\d+", css_color)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


@scenario
def keyboard_narrow_dark(chromium, server):
    """First load time; keyboard use; a 380 px window without horizontal scroll; dark mode."""
    # The first load of /console/ from a cold server: the cookie (from a login over plain HTTP)
    # and the token are set up front, so the page's first request is /console/ itself.
    status, _, headers = server.request("POST", "/console/login")
    assert status == 204, status
    name, value = headers["Set-Cookie"].split(";")[0].split("=", 1)
    context = chromium.new_context(viewport={"width": 1200, "height": 800})
    context.add_cookies([{"name": name, "value": value, "url": server.base + "/console/"}])
    context.add_init_script(f"sessionStorage.setItem('ctx-token', {json.dumps(ADMIN)})")
    page = context.new_page()
    page.goto(server.base + "/console/")
    page.wait_for_selector("html[data-ready=true]")
    ms = page.evaluate("performance.getEntriesByName('ctx-console-ready')[0].startTime")
    size = sum(os.path.getsize(os.path.join(CONSOLE_DIR, f)) for f in os.listdir(CONSOLE_DIR))
    print(f"console first load (cold server, navigation start to rendered): {ms:.0f} ms (target < 300 ms)", flush=True)
    print(f"console assets: {size / 1024:.1f} KB in {len(os.listdir(CONSOLE_DIR))} files (target < 500 KB)", flush=True)
    assert size < 500 * 1024, size
    context.close()

    c = Console(chromium, server)
    page = c.page
    # Keyboard: from the top of the page (its first stop, the skip link), Tab to the Tools link;
    # Enter follows it; the focus ring is visible.
    page.focus("a.skip")
    for _ in range(12):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.dataset.route") == "tools":
            break
    assert page.evaluate("document.activeElement.dataset.route") == "tools"
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("none", ""), outline
    page.keyboard.press("Enter")
    page.wait_for_function("location.hash === '#/tools'")
    # The list arrives from GET /tools/list: Tab through it only once it is there.
    page.wait_for_selector("[data-tool='echo']")
    say(f"Tab reaches the Tools link with a visible focus ring ({outline}); Enter opens it")
    # Tab on into the list, to echo, Enter; fill the form and submit it with Enter.
    for _ in range(40):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.dataset.tool") == "echo":
            break
    assert page.evaluate("document.activeElement.dataset.tool") == "echo"
    page.keyboard.press("Enter")
    page.wait_for_function("location.hash === '#/tools/echo'")
    page.wait_for_selector("article.tool[data-tool='echo'] [name='message']")
    for _ in range(10):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.name") == "message":
            break
    page.keyboard.type("typed")
    page.keyboard.press("Enter")
    expect(page.locator("article.tool[data-tool='echo'] .result")).to_contain_text('"message": "typed"')
    say("from the keyboard alone: Tools → echo → its form, sent with Enter, shows the result")

    # Narrow window: the nav wraps, nothing scrolls sideways, on every page.
    page.set_viewport_size({"width": 380, "height": 800})
    server.request("POST", "/tools/deploy", {"service": "a-service-with-a-rather-long-name-that-could-overflow"})
    for route in ("#/search", "#/sources", "#/tools/shape", "#/tools/execute", "#/approvals", "#/activity", "#/chat"):
        c.go(route)
        page.wait_for_timeout(400)
        width = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert width[0] <= width[1], f"{route} scrolls sideways at 380 px: {width}"
        right = page.evaluate("Math.max(...[...document.querySelectorAll('#nav a')].map(a => a.getBoundingClientRect().right))")
        assert right <= 380, f"{route}: the nav reaches {right} px"
    say("at 380 px every page fits: no horizontal scroll, the nav wraps")
    c.close()

    # Dark mode follows prefers-color-scheme.
    colors = {}
    for scheme in ("light", "dark"):
        c = Console(chromium, server, color_scheme=scheme)
        colors[scheme] = c.page.evaluate("[getComputedStyle(document.body).backgroundColor, getComputedStyle(document.body).color]")
        c.close()
    assert luminance(colors["dark"][0]) < 0.2 < luminance(colors["dark"][1]), colors
    assert luminance(colors["light"][0]) > 0.8 > luminance(colors["light"][1]), colors
    say(f"dark mode: background {colors['dark'][0]}, text {colors['dark'][1]} (light: {colors['light'][0]})")


def run(name):
    fn = SCENARIOS[name]
    needs_stub = fn.__code__.co_argcount == 3
    options = {}
    stub = None
    if needs_stub:
        stub = Stub(chat_reply)
        options["chat_url"] = stub.url
    if name in ("activity", "scoped"):
        options["upstream_fails"] = True
    if name == "no_token":
        options["auth"] = False
    if name == "tools":
        options["upstream_time"] = True
        options["extra"] = '\n[tools.scripted.triage]\ndescription = "Triage: search, then read."\ntools = ["search", "get"]\n'
    started = time.monotonic()
    with served(**options) as server, browser() as chromium:
        try:
            fn(chromium, server, stub) if needs_stub else fn(chromium, server)
        except BaseException:
            shots = tempfile.mkdtemp(prefix=f"console-{name}-")
            for i, ctx in enumerate(chromium.contexts):
                for j, page in enumerate(ctx.pages):
                    path = os.path.join(shots, f"page-{i}-{j}.png")
                    try:
                        page.screenshot(path=path, full_page=True)
                        print(f"screenshot: {path} ({page.url})", file=sys.stderr)
                    except Exception:
                        pass
            raise
        finally:
            if stub:
                stub.close()
    print(f"scenario {name}: {time.monotonic() - started:.1f} s", flush=True)


def main():
    names = sys.argv[1:] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; known: {list(SCENARIOS)}")
    failed = 0
    for name in names:
        try:
            run(name)
        except BaseException:
            failed += 1
            traceback.print_exc()
            print(f"FAILED: {name}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
