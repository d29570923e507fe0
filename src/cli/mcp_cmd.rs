//! `ctx mcp list` and `ctx mcp test`: the upstream MCP servers of a setup, as the running
//! server sees them or by connecting once.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value as Json};

use super::{CliError, Globals};
use crate::config::upstream::UpstreamSection;
use crate::config::Config;
use crate::tools::CallOptions;
use crate::types::UpstreamHealth;
use crate::upstream::{EventSink, Status, Upstreams};

/// How long a command waits for the configured servers to connect.
const CONNECT_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, clap::Subcommand)]
pub enum McpCommand {
    /// Show each upstream MCP server ([mcp.servers.*], mcp.import): its state, tools, restarts,
    /// last error and call latency. Asks the running server (GET /health at server.bind) and,
    /// when none answers, connects to each configured server once.
    List {
        /// Print JSON: {"source": "running"|"configured", "upstreams": [...]}.
        #[arg(long)]
        json: bool,
    },
    /// Connect to one upstream server, list its tools as ctx names them, and optionally call
    /// one through the same call path as every client. Exits 1 when it cannot connect or the
    /// call fails.
    Test {
        /// The server's name in [mcp.servers] (or the imported file).
        server: String,
        /// Call this tool (its upstream name, or ctx's <server>__<tool> name).
        #[arg(long, value_name = "TOOL")]
        call: Option<String>,
        /// A parameter of the call, typed by the tool's schema: --param count=3.
        #[arg(long = "param", value_name = "KEY=VALUE", requires = "call")]
        params: Vec<String>,
        /// Print JSON only.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: McpCommand, globals: &Globals) -> Result<(), CliError> {
    match cmd {
        McpCommand::List { json } => list(json, globals),
        McpCommand::Test { server, call, params, json } => test(&server, call.as_deref(), &params, json, globals),
    }
}

/// Starts `sections` and waits until each is ready or has failed an attempt.
pub(super) fn connect(runtime: &tokio::runtime::Handle, sections: &[UpstreamSection]) -> Arc<Upstreams> {
    let _guard = runtime.enter();
    let quiet: EventSink = Arc::new(|_| {});
    // Waiting as for required servers: each one either gets ready or reports why not.
    let waited: Vec<UpstreamSection> =
        sections.iter().cloned().map(|s| UpstreamSection { required: s.enabled, ..s }).collect();
    let upstreams = Upstreams::start(&waited, quiet);
    let _ = runtime.block_on(upstreams.required_ready(CONNECT_WAIT));
    upstreams
}

fn list(json: bool, globals: &Globals) -> Result<(), CliError> {
    let config = globals.load_config()?;
    let runtime = &globals.runtime;
    let (source, rows) = match runtime.block_on(from_running(&config)) {
        Some(rows) => ("running", rows),
        None => {
            let upstreams = connect(runtime, &config.upstreams);
            let rows: Vec<Json> = upstreams.status().into_iter().map(|s| status_json(&s)).collect();
            runtime.block_on(upstreams.shutdown());
            ("configured", rows)
        }
    };
    // Broken servers from ctx.toml and from the imported file alike.
    let broken: Vec<Json> = config
        .broken_upstreams()
        .map(|b| json!({"name": b.name, "state": "disabled", "last_error": b.message()}))
        .collect();
    let rows: Vec<Json> = rows.into_iter().chain(broken).collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&json!({"source": source, "upstreams": rows})).unwrap_or_default());
        return Ok(());
    }
    if rows.is_empty() {
        println!("no upstream MCP servers configured: add [mcp.servers.<name>] to ctx.toml, or mcp.import = \"<claude_desktop_config.json>\"");
        return Ok(());
    }
    let from = if source == "running" { "the running server" } else { "a one-off connection" };
    println!("upstream MCP servers (from {from}):");
    for row in &rows {
        let field = |k: &str| row.get(k).cloned().unwrap_or(Json::Null);
        let latency = field("latency_p50_ms").as_f64().map(|ms| format!(", p50 {ms:.2} ms")).unwrap_or_default();
        println!(
            "  {}  {}  ({}, {} tools, {} restarts, {} calls{latency})",
            field("name").as_str().unwrap_or_default(),
            field("state").as_str().unwrap_or_default(),
            field("transport").as_str().unwrap_or("-"),
            field("tools").as_u64().unwrap_or(0),
            field("restarts").as_u64().unwrap_or(0),
            field("calls").as_u64().unwrap_or(0),
        );
        if let Some(error) = field("last_error").as_str() {
            println!("      last error: {}", super::tool_cmd::printable(error));
        }
    }
    Ok(())
}

/// The upstreams of the server running at `server.bind`, when one answers with them.
async fn from_running(config: &Config) -> Option<Vec<Json>> {
    let server = super::running::Running::find(config).await?;
    let rows: Vec<UpstreamHealth> =
        serde_json::from_value(server.health.get("upstreams").cloned().unwrap_or(json!([]))).ok()?;
    Some(rows.into_iter().filter_map(|r| serde_json::to_value(r).ok()).collect())
}

fn status_json(status: &Status) -> Json {
    let mut row = json!({
        "name": status.name,
        "transport": status.transport,
        "state": status.state.as_str(),
        "tools": status.tools,
        "restarts": status.restarts,
        "attempt": status.attempt,
        "calls": status.calls,
    });
    if let Some(error) = &status.last_error {
        row["last_error"] = json!(error);
    }
    if let Some(ms) = status.latency_p50_ms {
        row["latency_p50_ms"] = json!(ms);
    }
    row
}

fn test(server: &str, call: Option<&str>, raw: &[String], json: bool, globals: &Globals) -> Result<(), CliError> {
    let pairs = super::tool_cmd::param_pairs(raw)?;
    let config = globals.load_config()?;
    let Some(section) = config.upstreams.iter().find(|s| s.name == server).cloned() else {
        if let Some(broken) = config.broken_upstreams().find(|b| b.name == server) {
            return Err(CliError::Usage(broken.message()));
        }
        let names: Vec<&str> = config.upstreams.iter().map(|s| s.name.as_str()).collect();
        return Err(CliError::Usage(format!(
            "no upstream MCP server '{server}' in {}; configured: {}",
            config.file.display(),
            if names.is_empty() { "none".to_string() } else { names.join(", ") }
        )));
    };
    let runtime = &globals.runtime;
    let section = UpstreamSection { enabled: true, ..section };
    let started = std::time::Instant::now();
    let upstreams = connect(runtime, std::slice::from_ref(&section));
    let result = report(runtime, &config, &upstreams, &section, call, &pairs, json, started.elapsed());
    runtime.block_on(upstreams.shutdown());
    result
}

#[allow(clippy::too_many_arguments)]
fn report(
    runtime: &tokio::runtime::Handle,
    config: &Config,
    upstreams: &Arc<Upstreams>,
    section: &UpstreamSection,
    call: Option<&str>,
    pairs: &[(String, String)],
    json: bool,
    took: Duration,
) -> Result<(), CliError> {
    let status = upstreams.status().into_iter().next();
    let ready = status.as_ref().is_some_and(|s| s.state == crate::upstream::State::Ready);
    if !ready {
        let why = status.and_then(|s| s.last_error).unwrap_or_else(|| "it did not connect in time".into());
        return Err(CliError::Failed(anyhow::anyhow!(
            "cannot connect to upstream MCP server '{}': {why}",
            section.name
        )));
    }
    // The registry every server uses, so names, filters, validation and results are exactly
    // what clients get.
    let kb = crate::app::database::open_kb(Arc::new(config.clone()), crate::app::database::Role::Server)?;
    let registry = Arc::new(crate::app::build(kb, None).with_upstreams(upstreams));
    let ours: Vec<_> =
        registry.all_specs().filter(|s| s.upstream.as_ref().is_some_and(|o| o.server == section.name)).collect();
    let Some(tool) = call else {
        if json {
            let tools: Vec<_> = ours.iter().map(|s| s.info()).collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({"server": section.name, "tools": tools})).unwrap_or_default()
            );
        } else {
            println!("connected to '{}' in {:.0} ms; {} tools:", section.name, took.as_secs_f64() * 1000.0, ours.len());
            for spec in &ours {
                println!("  {}", spec.name);
                if !spec.description.is_empty() {
                    let first = spec.description.lines().next().unwrap_or_default();
                    println!("      {}", super::tool_cmd::printable(first));
                }
            }
            for problem in registry.problems().iter().chain(registry.warnings()) {
                println!("  note: {}", super::tool_cmd::printable(&problem.message));
            }
        }
        return Ok(());
    };
    let name = ours
        .iter()
        .find(|s| s.name == tool || s.upstream.as_ref().is_some_and(|o| o.tool == tool))
        .map(|s| s.name.clone())
        .ok_or_else(|| {
            let names: Vec<&str> = ours.iter().map(|s| s.name.as_str()).collect();
            CliError::Usage(format!(
                "upstream server '{}' has no tool '{tool}'; its tools: {}",
                section.name,
                names.join(", ")
            ))
        })?;
    let spec = registry.spec(&name).expect("listed above");
    let params = spec.params.coerce(pairs).map_err(CliError::Usage)?;
    let options = CallOptions { caller: "cli", ..Default::default() };
    let _guard = runtime.enter();
    let outcome = registry.call(&name, params, &options);
    super::tool_cmd::print_outcome(outcome, false, json)
}
