//! On a real `ctx serve`: rate limits, approval (REST, the CLI, MCP with and without
//! elicitation, code mode), the tool-call log (every kind of call, redaction, retention,
//! `kill -9` under load) and `/metrics` read by the real Prometheus client library.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{repo, test_python, ServeChild};
use crate::scoped_tokens_and_rates::{ctx_in, serve, Server, ADMIN, CI};

const APPROVER: &str = "approver-token-0123456789";

/// A Lua tool that calls `echo` through `context.call`, and takes a secret-looking parameter.
const RELAY: &str = r#"
tool = {
    name = "relay",
    description = "Calls echo through context.call.",
    parameters = {
        { name = "message", type = "string", required = true },
        { name = "api_key", type = "string", required = false },
    },
}

function tool.execute(params, context)
    return context.call("echo", { message = params.message })
end
"#;

fn with_relay(extra: &str) -> Server {
    crate::scoped_tokens_and_rates::serve_with(
        &format!("\n[tools.script.relay]\npath = \"relay.lua\"\n{extra}"),
        &[("relay.lua", RELAY)],
    )
}

/// A POST from another thread (its own runtime): status and body.
fn post_from_thread(url: &str, body: &Value, timeout: Duration) -> Option<(u16, Value)> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = reqwest::Client::builder().timeout(timeout).build().unwrap();
        let response = client.post(url).bearer_auth(ADMIN).json(body).send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.json::<Value>().await.unwrap_or(Value::Null)))
    })
}

/// The calls the log holds, newest first, as `ctx log --json` prints them.
fn logged(s: &Server, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["log", "--json", "--limit", "100000"];
    all.extend_from_slice(args);
    let run = s.cli(&all);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    run.json()["calls"].as_array().unwrap().clone()
}

/// Waits until the log holds at least `n` entries matching `args` (the writer is behind the
/// call path by design).
fn wait_logged(s: &Server, n: usize, args: &[&str]) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let calls = logged(s, args);
        if calls.len() >= n || Instant::now() > deadline {
            return calls;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn rate_limits_answer_429_with_retry_after_per_caller_and_count_inner_calls() {
    let s = serve("\n[[server.rate_limits]]\ntools = [\"echo\"]\nrate = \"2/min\"\n");
    let call = |token: &str| s.send_with("/tools/echo", Some(token), &[], json!({"message": "m"}));
    assert_eq!(call(CI).0, 200);
    assert_eq!(call(CI).0, 200);
    let (status, body, retry) = call(CI);
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "rate_limited");
    let secs: u64 = retry.expect("Retry-After").parse().unwrap();
    assert!((1..=30).contains(&secs), "one call comes back every 30 s: {secs}");
    assert_eq!(body["error"]["data"]["retry_after_secs"], secs);
    assert!(body["error"]["message"].as_str().unwrap().contains("2/min per caller; retry in"), "{body}");
    // Another caller has its own bucket.
    assert_eq!(call(ADMIN).0, 200);
    // MCP: an error result with the wait.
    let refused = s.mcp(CI, "tools/call", Some("echo"), json!({"name": "echo", "arguments": {"message": "m"}}));
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert!(refused.to_string().contains("retry in"), "{refused}");
    // An inner call of a script counts against its caller too.
    assert_eq!(call(ADMIN).0, 200);
    let (status, out) = s.post(
        "/tools/execute",
        Some(ADMIN),
        json!({"script": "local ok, e = pcall(function() return ctx.echo({message = 'x'}):await() end)\nreturn {ok = ok, err = tostring(e)}"}),
    );
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["result"]["ok"], false, "{out}");
    assert!(out["result"]["err"].as_str().unwrap().contains("rate limit"), "{out}");
    // A script's call of a tool that cannot finish inline is charged once, not twice.
    let r = crate::scoped_tokens_and_rates::serve_with(
        "\n[tools.script.relay]\npath = \"relay.lua\"\nrate = \"2/min\"\n",
        &[("relay.lua", RELAY)],
    );
    let (status, out) =
        r.post("/tools/execute", Some(ADMIN), json!({"script": "return ctx.relay({message = 'x'}):await()"}));
    assert_eq!(status, 200, "{out}");
    assert_eq!(r.post("/tools/relay", Some(ADMIN), json!({"message": "y"})).0, 200, "the script used one call of two");
    assert_eq!(r.post("/tools/relay", Some(ADMIN), json!({"message": "z"})).0, 429);
    // A rate that is not one is a config error with its key.
    let ws = crate::common::Workspace::new("[[server.rate_limits]]\ntools = [\"echo\"]\nrate = \"10 per minute\"\n");
    let check = ws.ctx(&["schema", "check"]);
    assert_eq!(check.code(), 2);
    assert!(check.stderr().contains("server.rate_limits.0.rate"), "{}", check.stderr());
    assert!(check.stderr().contains("for example \"10/min\""), "{}", check.stderr());
}

#[test]
fn approval_over_rest_runs_once_with_the_token_and_refuses_everything_else() {
    let s = serve(&format!("\n[approval]\ntools = [\"echo\"]\napprover_token = \"{APPROVER}\"\n"));
    let ask = |token: &str, message: &str| s.send_with("/tools/echo", Some(token), &[], json!({"message": message}));
    let (status, pending, _) = ask(CI, "deploy");
    assert_eq!(status, 202, "{pending}");
    assert_eq!(pending["state"], "pending");
    assert_eq!(pending["tool"], "echo");
    assert_eq!(pending["params"], json!({"message": "deploy", "repeat": 1}));
    assert_eq!(pending["caller"], "ci");
    let (id, token) = (pending["id"].as_str().unwrap().to_string(), pending["token"].as_str().unwrap().to_string());
    assert!(pending["message"].as_str().unwrap().contains(&format!("ctx approvals approve {id}")), "{pending}");
    let with_token = |caller: &str, message: &str| {
        s.send_with("/tools/echo", Some(caller), &[("ctx-approval", &token)], json!({"message": message}))
    };
    // Fails closed: pending is not approved.
    let (status, again, _) = with_token(CI, "deploy");
    assert_eq!(status, 202, "{again}");
    // A scoped token cannot approve its own call.
    assert_eq!(s.post(&format!("/approvals/{id}/approve"), Some(CI), json!({})).0, 403);
    let listed = s.cli(&["approvals", "list"]);
    assert!(listed.ok().contains(&id), "{}", listed.stdout());
    let approved = s.cli(&["approvals", "approve", &id]);
    assert!(approved.ok().contains(&format!("approved {id}")), "{}", approved.stdout());
    // Wrong parameters and another caller are refused, and use nothing up.
    let (status, body, _) = with_token(CI, "something else");
    assert_eq!(status, 403, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("other parameters"), "{body}");
    let (status, body, _) = with_token(ADMIN, "deploy");
    assert_eq!(status, 403, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("another caller"), "{body}");
    // The call it was issued for runs once.
    let (status, body, _) = with_token(CI, "deploy");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["message"], "deploy");
    let (status, body, _) = with_token(CI, "deploy");
    assert_eq!(status, 403, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("used already"), "{body}");
    // `_approval` beside the arguments works as the header does; deny over REST with a reason.
    let (_, second, _) = ask(CI, "rollback");
    let second_id = second["id"].as_str().unwrap();
    // The token a client calls with cannot decide: REST needs the approver token beside it.
    let deny = |headers: &[(&str, &str)]| {
        s.send_with(&format!("/approvals/{second_id}/deny"), Some(ADMIN), headers, json!({"reason": "not today"}))
    };
    let (status, body, _) = deny(&[]);
    assert_eq!(status, 403, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("Ctx-Approver"), "{body}");
    assert_eq!(deny(&[("ctx-approver", "wrong-approver-token-000")]).0, 403);
    let (status, denied, _) = deny(&[("ctx-approver", APPROVER)]);
    assert_eq!(status, 200, "{denied}");
    assert_eq!(denied["state"], "denied");
    let (status, body, _) =
        s.send_with("/tools/echo", Some(CI), &[], json!({"message": "rollback", "_approval": second["token"]}));
    assert_eq!(status, 403, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("denied by rest: not today"), "{body}");
    // Deciding twice is a conflict; an unknown id is 404.
    let approve = |id: &str| {
        s.send_with(&format!("/approvals/{id}/approve"), Some(ADMIN), &[("ctx-approver", APPROVER)], json!({})).0
    };
    assert_eq!(approve(second_id), 409);
    assert_eq!(approve("ap-nope"), 404);
    let (_, all) = s.get("/approvals?all=true", Some(ADMIN));
    let states: Vec<&str> = all["approvals"].as_array().unwrap().iter().map(|a| a["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["denied", "used"], "{all}");
    // No token in the list, the server log or the call log.
    let log = s.serve.stderr.lock().unwrap().clone();
    assert!(!all.to_string().contains(&token) && !log.contains(&token));
    let calls = wait_logged(&s, 8, &["--tool", "echo"]);
    assert!(!serde_json::to_string(&calls).unwrap().contains(&token), "a token in the call log");
    let outcomes: Vec<&str> = calls.iter().map(|c| c["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes.iter().filter(|o| **o == "ok").count(), 1, "exactly one call ran: {outcomes:?}");
}

#[test]
fn an_approval_expires() {
    let s = serve("\n[approval]\ntools = [\"echo\"]\nttl_secs = 1\n");
    let (status, pending, _) = s.send_with("/tools/echo", Some(CI), &[], json!({"message": "m"}));
    assert_eq!(status, 202);
    let id = pending["id"].as_str().unwrap();
    // Wait for the store to call it expired, not for a fixed time.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, all) = s.get("/approvals?all=true", Some(ADMIN));
        if all["approvals"][0]["state"] == "expired" {
            break;
        }
        assert!(Instant::now() < deadline, "the approval never expired: {all}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let late = s.cli(&["approvals", "approve", id]);
    assert_eq!(late.code(), 2);
    assert!(late.stderr().contains("is expired, not pending"), "{}", late.stderr());
    let (status, body, _) = s.send_with(
        "/tools/echo",
        Some(CI),
        &[("ctx-approval", pending["token"].as_str().unwrap())],
        json!({"message": "m"}),
    );
    assert_eq!(status, 403, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("expired"), "{body}");
}

#[test]
fn approval_in_code_mode_fails_with_the_waiting_call_or_waits_for_a_person() {
    let s = serve("\n[approval]\ntools = [\"echo\"]\n");
    let (status, out) = s.post(
        "/tools/execute",
        Some(ADMIN),
        json!({"script": "local r = ctx.echo({message = 'ship it'}):await()\nreturn r"}),
    );
    assert_eq!(status, 500, "{out}");
    // The script's error names the call that waits: its tool, the approval's id and what a
    // person runs to approve it.
    let waiting = &out["error"]["data"]["data"]["error"];
    assert_eq!(
        (&waiting["code"], &waiting["tool"], &waiting["call"]),
        (&json!("approval_required"), &json!("echo"), &json!("ctx.echo")),
        "{out}"
    );
    let message = waiting["message"].as_str().unwrap_or_default();
    let id =
        message.split_whitespace().find(|w| w.starts_with("ap-")).unwrap_or_else(|| panic!("no approval id: {out}"));
    assert!(message.starts_with("tool 'echo' needs approval"), "{out}");
    assert!(message.contains(&format!("`ctx approvals approve {id}`")), "{out}");
    assert_eq!(out["error"]["data"]["data"]["trace"]["calls"][0]["code"], "approval_required", "{out}");

    let s = serve("\n[approval]\ntools = [\"echo\"]\nin_scripts = \"wait\"\n");
    let script = json!({"script": "return ctx.echo({message = 'ship it'}):await()"});
    let url = s.url("/tools/execute");
    let waiting = std::thread::spawn(move || post_from_thread(&url, &script, Duration::from_secs(40)).unwrap());
    // A person approves what the script waits for.
    let deadline = Instant::now() + Duration::from_secs(10);
    let id = loop {
        let listed = s.cli(&["approvals", "list", "--json"]).json();
        if let Some(a) = listed["approvals"].as_array().unwrap().first() {
            break a["id"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "no approval appeared");
        std::thread::sleep(Duration::from_millis(100));
    };
    s.cli(&["approvals", "approve", &id]).ok();
    let (status, out) = waiting.join().unwrap();
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["result"]["message"], "ship it", "{out}");
}

/// A script's call that waits for a person (`in_scripts = "wait"`) is asked inside the call: it
/// is one entry in the call log, with the outcome after the decision, not a refused entry and a
/// second one for the run.
#[test]
fn a_script_call_that_waits_for_approval_is_one_call_log_entry() {
    let s = serve("\n[approval]\ntools = [\"echo\"]\nin_scripts = \"wait\"\n");
    let script = json!({"script": "return ctx.echo({message = 'once'}):await()"});
    let url = s.url("/tools/execute");
    let waiting = std::thread::spawn(move || post_from_thread(&url, &script, Duration::from_secs(40)).unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    let id = loop {
        let listed = s.cli(&["approvals", "list", "--json"]).json();
        if let Some(a) = listed["approvals"].as_array().unwrap().first() {
            break a["id"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "no approval appeared");
        std::thread::sleep(Duration::from_millis(100));
    };
    s.cli(&["approvals", "approve", &id]).ok();
    let (status, out) = waiting.join().unwrap();
    assert_eq!(status, 200, "{out}");
    // The script's own entry is written after its inner call's.
    assert_eq!(wait_logged(&s, 1, &["--tool", "execute"]).len(), 1);
    let echo = logged(&s, &["--tool", "echo"]);
    let outcomes: Vec<&str> = echo.iter().map(|c| c["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["ok"], "{echo:?}");
}

/// Runs tests/clients/ops_client.py `call` against the server (a 2025-11-25 session).
pub(crate) fn mcp_client_call(s: &Server, token: &str, answer: &str, args: Value) -> Option<Value> {
    mcp_client_call_in(s, token, answer, "2025", args)
}

/// [`mcp_client_call`] in a protocol era: `2025` (a session) or `2026` (stateless).
pub(crate) fn mcp_client_call_in(s: &Server, token: &str, answer: &str, era: &str, args: Value) -> Option<Value> {
    let python = test_python()?;
    let output = std::process::Command::new(python)
        .arg(repo().join("tests/clients/ops_client.py"))
        .args(["call", "--url", &s.url("/mcp"), "--token", token, "--tool", "echo", "--answer", answer])
        .args(["--era", era])
        .args(["--args", &args.to_string()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    Some(serde_json::from_slice(&output.stdout).unwrap())
}

#[test]
fn approval_over_mcp_asks_a_client_that_can_elicit_and_tells_one_that_cannot() {
    // Asking clients is the operator's choice, and then for the unscoped token (a scoped one needs
    // approve_own_calls: see security_scopes).
    let s = serve("\n[approval]\ntools = [\"echo\"]\nask_clients = true\n");
    let Some(approved) = mcp_client_call(&s, ADMIN, "approve", json!({"message": "from mcp"})) else { return };
    assert_eq!(approved["isError"], false, "{approved}");
    assert!(approved["text"].as_str().unwrap().contains("from mcp"), "{approved}");
    let asked = &approved["elicited"][0];
    assert!(asked["message"].as_str().unwrap().contains("Allow the tool 'echo'"), "{approved}");
    assert_eq!(asked["schema"]["properties"]["approve"]["type"], "boolean", "{approved}");

    let declined = mcp_client_call(&s, ADMIN, "decline", json!({"message": "no"})).unwrap();
    assert_eq!(declined["isError"], true, "{declined}");
    assert!(declined["text"].as_str().unwrap().contains("the user declined it"), "{declined}");

    let pending = mcp_client_call(&s, ADMIN, "none", json!({"message": "later"})).unwrap();
    assert_eq!(pending["isError"], true, "{pending}");
    assert!(pending["text"].as_str().unwrap().contains("needs approval"), "{pending}");
    let approval = &pending["structured"]["approval"];
    let (id, token) = (approval["id"].as_str().unwrap(), approval["token"].as_str().unwrap());
    // A person approves it; the same call with the token beside the arguments runs.
    s.cli(&["approvals", "approve", id]).ok();
    let ran = mcp_client_call(&s, ADMIN, "none", json!({"message": "later", "_approval": token})).unwrap();
    assert_eq!(ran["isError"], false, "{ran}");
    let (_, all) = s.get("/approvals?all=true", Some(ADMIN));
    let by: Vec<&str> = all["approvals"].as_array().unwrap().iter().filter_map(|a| a["decided_by"].as_str()).collect();
    assert_eq!(by, ["cli", "mcp elicitation", "mcp elicitation"], "{all}");

    // 2026-07-28 (stateless): an input-required result, answered by calling again.
    let modern = mcp_client_call_in(&s, ADMIN, "approve", "2026", json!({"message": "stateless"})).unwrap();
    assert_eq!(modern["isError"], false, "{modern}");
    assert!(modern["text"].as_str().unwrap().contains("stateless"), "{modern}");
    assert!(modern["elicited"][0]["message"].as_str().unwrap().contains("Allow the tool 'echo'"), "{modern}");
    let declined = mcp_client_call_in(&s, ADMIN, "decline", "2026", json!({"message": "stateless no"})).unwrap();
    assert_eq!(declined["isError"], true, "{declined}");
    assert!(declined["text"].as_str().unwrap().contains("declined"), "{declined}");

    // Holding a token is not being asked: an answer with a REST caller's token is refused.
    let (status, pending, _) = s.send_with("/tools/echo", Some(CI), &[], json!({"message": "forged"}));
    assert_eq!(status, 202);
    let forged = s.mcp(
        CI,
        "tools/call",
        Some("echo"),
        json!({"name": "echo", "arguments": {"message": "forged"},
               "inputResponses": {"ctx_approval": {"action": "accept", "content": {"approve": true}}},
               "requestState": pending["token"]}),
    );
    assert!(forged.to_string().contains("does not come from a question this server asked"), "{forged}");
    let listed = s.cli(&["approvals", "list", "--json"]).json();
    let still = listed["approvals"].as_array().unwrap().iter().find(|a| a["id"] == pending["id"]).unwrap();
    assert_eq!(still["state"], "pending", "a forged answer decides nothing");
}

#[test]
fn with_ask_clients_off_only_people_decide() {
    let s = serve("\n[approval]\ntools = [\"echo\"]\nask_clients = false\n");
    let Some(result) = mcp_client_call(&s, CI, "approve", json!({"message": "m"})) else { return };
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(result["elicited"], json!([]), "the client was not asked: {result}");
    assert!(result["text"].as_str().unwrap().contains("ctx approvals approve"), "{result}");
}

#[test]
fn the_call_log_has_every_kind_of_call_linked_redacted_and_filtered() {
    let s = with_relay("");
    // REST, MCP, a context.call inside a Lua tool, code mode's inner call, and the CLI.
    assert_eq!(s.post("/tools/relay", Some(ADMIN), json!({"message": "a", "api_key": "sk-very-secret"})).0, 200);
    let over_mcp = s.mcp(CI, "tools/call", Some("echo"), json!({"name": "echo", "arguments": {"message": "b"}}));
    assert_eq!(over_mcp["result"]["isError"], false, "{over_mcp}");
    let (status, out) =
        s.post("/tools/execute", Some(ADMIN), json!({"script": "return ctx.echo({message = 'c'}):await()"}));
    assert_eq!(status, 200, "{out}");
    assert_eq!(s.post("/tools/echo", Some(ADMIN), json!({"message": 5})).0, 400);
    let cli = ctx_in(&s.ws, &["tool", "call", "echo", "--param", "message=d"]).output().unwrap();
    assert!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));
    let calls = wait_logged(&s, 7, &[]);
    let find = |tool: &str, via: &str| {
        calls
            .iter()
            .find(|c| c["tool"] == tool && c["via"] == via)
            .unwrap_or_else(|| panic!("no {tool} call via {via}: {calls:#?}"))
    };
    let relay = find("relay", "rest");
    assert_eq!(relay["params"]["api_key"], "[redacted]", "{relay}");
    assert!(!serde_json::to_string(&calls).unwrap().contains("sk-very-secret"));
    let inner = find("echo", "lua");
    assert_eq!(inner["parent"], relay["id"], "context.call is linked to its caller");
    let mcp = find("echo", "mcp");
    assert_eq!(mcp["caller"], "ci");
    assert_eq!(mcp["result"]["message"], "b");
    let execute = find("execute", "rest");
    assert_eq!(find("echo", "code")["parent"], execute["id"], "a script's inner call is linked to it");
    find("echo", "cli");
    let failed = calls.iter().find(|c| c["outcome"] == "bad_request").expect("the failed call");
    assert!(failed["message"].as_str().unwrap().contains("/message"), "{failed}");
    // Filters: errors, tool, caller; and GET /calls, where a scoped token sees its own calls.
    assert_eq!(logged(&s, &["--errors"]).len(), 1);
    assert!(logged(&s, &["--tool", "relay"]).iter().all(|c| c["tool"] == "relay"));
    assert_eq!(logged(&s, &["--caller", "ci"]).len(), 1);
    assert_eq!(logged(&s, &["--since", "1h"]).len(), calls.len());
    let (status, page) = s.get("/calls?tool=echo&limit=2", Some(ADMIN));
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["calls"].as_array().unwrap().len(), 2);
    let before = page["next_before"].as_i64().expect("a next page");
    let (_, next) = s.get(&format!("/calls?tool=echo&before={before}"), Some(ADMIN));
    assert!(next["calls"].as_array().unwrap().iter().all(|c| c["seq"].as_i64().unwrap() < before));
    let (_, mine) = s.get("/calls", Some(CI));
    assert!(mine["calls"].as_array().unwrap().iter().all(|c| c["caller"] == "ci"), "{mine}");
    assert_eq!(s.get("/calls?since=yesterday", Some(ADMIN)).0, 400);
    assert_eq!(s.get("/calls?colour=red", Some(ADMIN)).0, 400);
    // Plain output: one line a call, oldest first.
    let plain = s.cli(&["log", "--tool", "relay"]).ok();
    assert!(plain.contains("relay") && plain.contains("rest"), "{plain}");
}

/// `ctx log`'s columns line up whatever the outcome (`approval_required` is longer than `ok`),
/// the tool and the caller: every row's fields start at the same place.
#[test]
fn the_plain_call_log_keeps_its_columns_aligned() {
    let s = serve(&format!("\n[approval]\ntools = [\"echo\"]\napprover_token = \"{APPROVER}\"\n"));
    assert_eq!(s.send_with("/tools/echo", Some(CI), &[], json!({"message": "deploy"})).0, 202);
    assert_eq!(s.post("/tools/search", Some(ADMIN), json!({"query": "deploy"})).0, 200);
    assert_eq!(s.post("/tools/search", Some(CI), json!({"query": ""})).0, 400);
    assert_eq!(s.post("/tools/execute", Some(ADMIN), json!({"script": "return 1"})).0, 200);
    wait_logged(&s, 4, &[]);
    let plain = s.cli(&["log"]).ok();
    let rows: Vec<&str> = plain.lines().filter(|l| !l.starts_with(' ')).collect();
    assert!(rows.len() >= 4, "{plain}");
    assert!(plain.contains("approval_required") && plain.contains("bad_request"), "{plain}");
    // The character offset of each whitespace-separated field: date, time, outcome, ms, "ms",
    // tool, caller, parameters. The milliseconds are right-aligned, so their end lines up.
    let starts = |row: &str| -> Vec<usize> {
        let chars: Vec<char> = row.chars().collect();
        (0..chars.len()).filter(|&i| chars[i] != ' ' && (i == 0 || chars[i - 1] == ' ')).take(8).collect()
    };
    let first = starts(rows[0]);
    assert_eq!(first.len(), 8, "{}", rows[0]);
    for row in &rows {
        let at = starts(row);
        for field in [2, 4, 5, 6, 7] {
            assert_eq!(at[field], first[field], "field {field} of\n{row}\nis not under that of\n{}", rows[0]);
        }
    }
}

/// A call whose client went away before it finished is logged as cancelled: a Lua tool on the
/// blocking pool, and a script with its inner call in flight.
#[test]
fn a_call_the_client_left_is_logged_as_cancelled() {
    let slow =
        "tool = { name = \"slow\", description = \"Sleeps.\" }\nfunction tool.execute() sleep(5) return \"late\" end\n";
    let s = crate::scoped_tokens_and_rates::serve_with(
        "\n[tools.script.slow]\npath = \"slow.lua\"\n",
        &[("slow.lua", slow)],
    );
    let url = |tool: &str| format!("http://{}/tools/{tool}", s.serve.addr);
    let gone = post_from_thread(&url("slow"), &json!({}), Duration::from_millis(400));
    assert!(gone.is_none(), "the client should have given up: {gone:?}");
    let script = json!({"script": "return ctx.slow({}):await()"});
    assert!(post_from_thread(&url("execute"), &script, Duration::from_millis(400)).is_none());
    let calls = wait_logged(&s, 2, &["--tool", "slow"]);
    let calls: Vec<Value> = calls.into_iter().chain(logged(&s, &["--tool", "execute"])).collect();
    let outcome = |tool: &str, via: &str| {
        let call = calls.iter().find(|c| c["tool"] == tool && c["via"] == via);
        call.unwrap_or_else(|| panic!("no {tool} call via {via}: {calls:#?}"))["outcome"].clone()
    };
    assert_eq!(outcome("slow", "rest"), "cancelled");
    assert_eq!(outcome("execute", "rest"), "cancelled");
    assert_eq!(outcome("slow", "code"), "cancelled");
}

#[test]
fn the_call_log_keeps_at_most_max_entries() {
    let mut s = serve("\n[log]\nmax_entries = 100\n");
    for i in 0..130 {
        assert_eq!(s.post("/tools/echo", Some(ADMIN), json!({"message": format!("m{i}")})).0, 200);
    }
    wait_logged(&s, 130, &[]);
    // Retention runs when a writer starts and once a minute: restart the server.
    let _ = s.serve.child.kill();
    let _ = s.serve.child.wait();
    s.serve = ServeChild::spawn(&mut ctx_in(&s.ws, &["serve", "--bind", "127.0.0.1:0"]));
    assert_eq!(s.post("/tools/echo", Some(ADMIN), json!({"message": "last"})).0, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let calls = logged(&s, &[]);
        if calls.len() <= 100 && calls[0]["params"]["message"] == "last" {
            assert_eq!(calls.len(), 100);
            assert_eq!(calls.last().unwrap()["params"]["message"], "m31", "the oldest went first");
            break;
        }
        assert!(Instant::now() < deadline, "still {} entries", calls.len());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Entries the log has committed (a reader sees them) while calls keep coming survive a kill -9
/// of the server in the middle of that load, and the log's database stays intact. (Calls answered
/// but not yet written may be lost: the log is written behind the answers.)
#[test]
fn kill_9_under_load_keeps_every_committed_entry() {
    let mut s = serve("");
    let url = s.url("/tools/echo");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (url, stop) = (url.clone(), std::sync::Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = post_from_thread(&url, &json!({"message": "load"}), Duration::from_secs(5));
                }
            })
        })
        .collect();
    let ids = |s: &Server| -> Vec<i64> {
        let (_, seen) = s.get("/calls?limit=1000", Some(ADMIN));
        seen["calls"].as_array().unwrap().iter().map(|c| c["id"].as_i64().unwrap()).collect()
    };
    // What the log committed while the load runs: more than 50 entries.
    let deadline = Instant::now() + Duration::from_secs(30);
    let committed = loop {
        let seen = ids(&s);
        if seen.len() > 50 {
            break seen;
        }
        assert!(Instant::now() < deadline, "the load wrote only {} entries", seen.len());
        std::thread::sleep(Duration::from_millis(20));
    };
    // Killed while the log is still being written: newer entries have appeared since.
    let newest = committed.iter().max().copied().unwrap();
    while ids(&s).iter().max().copied().unwrap_or(0) <= newest {
        assert!(Instant::now() < deadline, "the log stopped growing under load");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = s.serve.child.kill(); // SIGKILL
    let _ = s.serve.child.wait();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for thread in load {
        thread.join().unwrap();
    }
    let after: std::collections::HashSet<i64> = logged(&s, &[]).iter().map(|c| c["id"].as_i64().unwrap()).collect();
    let lost: Vec<&i64> = committed.iter().filter(|id| !after.contains(id)).collect();
    assert!(lost.is_empty(), "{} committed entries lost", lost.len());
    let conn = rusqlite::Connection::open(s.ws.path().join("data/calls.sqlite")).unwrap();
    let check: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(check, "ok");
}

#[test]
fn metrics_parse_with_the_prometheus_client_and_are_not_for_scoped_tokens() {
    let s = with_relay("\n[approval]\ntools = [\"relay\"]\n");
    for _ in 0..3 {
        assert_eq!(s.post("/tools/echo", Some(ADMIN), json!({"message": "m"})).0, 200);
    }
    assert_eq!(s.post("/tools/echo", Some(ADMIN), json!({})).0, 400);
    assert_eq!(s.post("/tools/relay", Some(ADMIN), json!({"message": "m"})).0, 202);
    assert_eq!(s.get("/metrics", Some(CI)).0, 403);
    assert_eq!(s.get("/metrics", None).0, 401);
    let Some(python) = test_python() else { return };
    let output = std::process::Command::new(python)
        .arg(repo().join("tests/clients/ops_client.py"))
        .args(["metrics", "--url", &s.url("/metrics"), "--token", ADMIN])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let parsed: Value = serde_json::from_slice(&output.stdout).unwrap();
    let families = &parsed["families"];
    let sample = |family: &str, name: &str, labels: Value| -> f64 {
        let samples = families[family]["samples"].as_array().unwrap_or_else(|| panic!("no {family}: {parsed}"));
        let found = samples
            .iter()
            .find(|s| s["name"] == name && labels.as_object().unwrap().iter().all(|(k, v)| s["labels"][k] == *v));
        found.unwrap_or_else(|| panic!("no {name} {labels} in {family}"))["value"].as_f64().unwrap()
    };
    assert_eq!(families["ctx_tool_calls"]["type"], "counter");
    assert_eq!(sample("ctx_tool_calls", "ctx_tool_calls_total", json!({"tool": "echo", "outcome": "ok"})), 3.0);
    assert_eq!(
        sample("ctx_tool_calls", "ctx_tool_calls_total", json!({"tool": "echo", "outcome": "bad_request"})),
        1.0
    );
    assert_eq!(families["ctx_tool_call_duration_seconds"]["type"], "histogram");
    let count = json!({"tool": "echo"});
    assert_eq!(sample("ctx_tool_call_duration_seconds", "ctx_tool_call_duration_seconds_count", count), 4.0);
    assert_eq!(sample("ctx_approvals_pending", "ctx_approvals_pending", json!({})), 1.0);
    assert_eq!(sample("ctx_source_syncs", "ctx_source_syncs_total", json!({"source": "filesystem:docs"})), 1.0);
    assert_eq!(sample("ctx_source_documents", "ctx_source_documents", json!({"source": "filesystem:docs"})), 1.0);
    assert_eq!(sample("ctx_call_log_dropped", "ctx_call_log_dropped_total", json!({})), 0.0);
}

/// One scoped token runs at most half of code mode's places at once: its ninth script is
/// refused while its eight run, and another caller's script still runs.
#[test]
fn one_token_cannot_take_every_code_mode_place() {
    let s = serve("");
    let url = s.url("/tools/execute");
    let post = |url: String, token: &'static str| {
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
                // Long enough that all eight overlap even when a loaded machine starts them
                // seconds apart (3 s failed once under the full suite).
                let body = json!({"script": "sleep(8) return 'done'"});
                let response = client.post(url).bearer_auth(token).json(&body).send().await.unwrap();
                (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
            })
        })
    };
    let eight: Vec<_> = (0..8).map(|_| post(url.clone(), CI)).collect();
    // Until all eight run, a ninth may still get in: wait for the server to say so.
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let (status, body, _) = s.send_with("/tools/execute", Some(CI), &[], json!({"script": "return 1"}));
        if status == 503 {
            break body;
        }
        assert!(Instant::now() < deadline, "the ninth script of one token was never refused: {status} {body}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(refused["error"]["message"].as_str().unwrap().contains("token 'ci' already runs 8"), "{refused}");
    let (status, body, _) = s.send_with("/tools/execute", Some(ADMIN), &[], json!({"script": "return 1"}));
    assert_eq!((status, &body["result"]), (200, &json!(1)), "{body}");
    for run in eight {
        let (status, body) = run.join().unwrap();
        assert_eq!((status, &body["result"]), (200, &json!("done")), "{body}");
    }
    // Their places are given back.
    let (status, body, _) = s.send_with("/tools/execute", Some(CI), &[], json!({"script": "return 2"}));
    assert_eq!((status, &body["result"]), (200, &json!(2)), "{body}");
}
