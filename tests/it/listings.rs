//! What is offered can be called: an upstream tool that runs only as an MCP task is listed and
//! its calls run as tasks on its server, and the tools scripts may not call are left out of
//! what code mode shows a script's author.

use crate::common::{test_command, Workspace};

#[test]
fn an_upstream_tool_that_runs_only_as_a_task_is_listed_and_its_call_completes() {
    let Some(everything) = test_command("CTX_TEST_EVERYTHING") else { return };
    let args: Vec<String> = everything[1..].iter().map(|a| format!("{a:?}")).chain(["\"stdio\"".to_string()]).collect();
    let ws = Workspace::new(&format!(
        "[mcp.servers.everything]\ncommand = {:?}\nargs = [{}]\n",
        everything[0],
        args.join(", ")
    ));
    let listed = ws.ctx(&["tool", "list"]).ok();
    assert!(listed.contains("everything__get-sum"), "{listed}");
    assert!(listed.lines().any(|l| l.starts_with("everything__simulate-research-query")), "{listed}");
    assert!(!listed.contains("runs only as an MCP task"), "no warning about it any more: {listed}");
    // The plain call of ctx's caller becomes a task on the server: created, polled, its result
    // fetched. `ambiguous` would make it ask for clarification of a client that declares
    // elicitation; ctx declares none, so the server goes on with no answer to wait for.
    let call = ws.ctx(&[
        "tool",
        "call",
        "everything__simulate-research-query",
        "--param",
        "topic=x",
        "--param",
        "ambiguous=true",
    ]);
    let out = call.ok();
    assert!(
        out.contains("Research Report: x") && out.contains("Stage 4: Generating report"),
        "{out}\n{}",
        call.stderr()
    );
}

#[test]
fn code_mode_shows_no_tool_scripts_may_not_call() {
    let ws = Workspace::new("[code_mode]\ndestructive = [\"echo\"]\n");
    let tool = |name: &str, body: &str| {
        format!(
            "tool = {{ name = {name:?}, description = {name:?}, parameters = {{ {{ name = \"text\", type = \"string\", required = true }} }} }}\nfunction tool.execute(params, context)\n{body}\nend\n"
        )
    };
    ws.write("tools/echo.lua", &tool("echo", "return params.text"));
    ws.write("tools/upper.lua", &tool("upper", "return params.text:upper()"));
    let config = std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap();
    std::fs::write(
        ws.path().join("ctx.toml"),
        format!("{config}\n[tools.script.echo]\npath = \"tools/echo.lua\"\n\n[tools.script.upper]\npath = \"tools/upper.lua\"\n"),
    )
    .unwrap();
    let catalog = ws.ctx(&["catalog"]).ok();
    assert!(catalog.contains("ctx.upper(") && !catalog.contains("ctx.echo("), "{catalog}");
    let run = |tool: &str, param: &str| ws.ctx(&["tool", "call", tool, "--json", "--param", param]);
    let listed = run("list_tools", "server=ctx");
    assert!(listed.stdout().contains("upper") && !listed.stdout().contains("echo"), "{}", listed.stdout());
    let described = run("describe_tool", "name=ctx.echo");
    assert_ne!(described.code(), 0, "{}", described.stdout());
    // A script that calls it anyway is told why.
    ws.write("call_echo.lua", "return ctx.echo({text = 'x'}):await()");
    let called = ws.ctx(&["run", "--local", "call_echo.lua"]);
    assert!(called.stderr().contains("destructive"), "{}", called.stderr());
}
