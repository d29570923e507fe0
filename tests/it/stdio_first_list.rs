//! `ctx serve --stdio`: a desktop client's first `tools/list` already holds the tools of every
//! upstream that gets ready within `[mcp] stdio_wait`, and the log names those that did not.

use std::time::{Duration, Instant};

use crate::common::{test_command, Workspace};
use crate::gateway::{fault_section, McpStdio};

/// A `[mcp.servers.<name>]` section running `command` (a test environment command line).
fn section(name: &str, command: &[String], extra_args: &[&str]) -> String {
    let args: Vec<String> =
        command[1..].iter().map(String::as_str).chain(extra_args.iter().copied()).map(|a| format!("{a:?}")).collect();
    format!("[mcp.servers.{name}]\ncommand = {:?}\nargs = [{}]\n", command[0], args.join(", "))
}

fn names(tools: &[serde_json::Value]) -> Vec<String> {
    tools.iter().filter_map(|t| t["name"].as_str().map(str::to_string)).collect()
}

#[test]
fn the_first_tools_list_on_stdio_holds_the_tools_of_real_upstreams() {
    let Some(everything) = test_command("CTX_TEST_EVERYTHING") else { return };
    let Some(time) = test_command("CTX_TEST_TIME_SERVER") else { return };
    // Generous for a loaded machine: the wait ends as soon as both are ready.
    let config = format!(
        "[mcp]\nstdio_wait = 30\n\n{}\n{}",
        section("everything", &everything, &["stdio"]),
        section("time", &time, &[])
    );
    let ws = Workspace::new(&config);
    let (mut client, log) = McpStdio::start_logged(&ws);
    let first = names(&client.tools());
    for tool in ["search", "everything__get-sum", "everything__echo", "time__get_current_time"] {
        assert!(first.contains(&tool.to_string()), "{tool} missing from the first tools/list: {first:?}");
    }
    // And an early call works at once: nothing says "connecting".
    let (result, _) =
        client.request("tools/call", serde_json::json!({"name": "everything__get-sum", "arguments": {"a": 2, "b": 5}}));
    assert_eq!(result["result"]["content"][0]["text"], "The sum of 2 and 5 is 7.", "{result}");
    let log = log.lock().unwrap().clone();
    assert!(!log.contains("not ready within"), "{log}");
}

#[test]
fn a_server_not_ready_within_stdio_wait_is_named_and_the_list_goes_without_it() {
    let config = format!("[mcp]\nstdio_wait = 1\n\n{}", fault_section("slow", &["--hang-at-start"], ""));
    let ws = Workspace::new(&config);
    let (mut client, log) = McpStdio::start_logged(&ws);
    let started = Instant::now();
    let first = names(&client.tools());
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(10), "the first list took {took:?}");
    assert!(first.contains(&"search".to_string()) && !first.iter().any(|n| n.starts_with("slow__")), "{first:?}");
    // The second list does not wait again.
    let started = Instant::now();
    client.tools();
    assert!(started.elapsed() < Duration::from_millis(500), "the second list waited {:?}", started.elapsed());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let said = log.lock().unwrap().clone();
        if said.contains("not ready within 1 s") && said.contains("stdio_wait") && said.contains("slow") {
            break;
        }
        assert!(Instant::now() < deadline, "the log does not name the late server: {said}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
