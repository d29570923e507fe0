//! `ctx run` and `ctx catalog`: code mode from the terminal, for people writing and debugging
//! the scripts agents send. A script runs through the same registry, limits and call path as
//! `execute` over REST or MCP.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use serde_json::{json, Value as Json};

use super::tool_cmd::{call_failed, upstreams_of, with_upstreams};
use super::{CliError, Globals};
use crate::kb::Kb;
use crate::tools::{CallOptions, Output};

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The Lua script to run (`-` reads it from stdin).
    pub script: PathBuf,
    /// Run it as this scripted tool ([tools.scripted.<name>]) instead of `execute`.
    #[arg(long)]
    pub scripted: Option<String>,
    /// Seconds the script may run (at most the configured limit).
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Print the REST body ({"result": ..., "trace": ...}) instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct CatalogArgs {
    /// The catalog of this scripted tool instead of `execute`'s.
    #[arg(long)]
    pub scripted: Option<String>,
}

/// `ctx run script.lua`.
pub fn run(args: RunArgs, globals: &Globals) -> Result<(), CliError> {
    let script = if args.script.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("cannot read the script from stdin")?;
        text
    } else {
        std::fs::read_to_string(&args.script).with_context(|| format!("cannot read {}", args.script.display()))?
    };
    let config = globals.load_config()?;
    let tool = args.scripted.clone().unwrap_or_else(|| "execute".to_string());
    if let Some(name) = &args.scripted {
        if !config.scripted.iter().any(|s| &s.name == name) {
            let names: Vec<&str> = config.scripted.iter().map(|s| s.name.as_str()).collect();
            let names = if names.is_empty() { "none configured".to_string() } else { names.join(", ") };
            return Err(CliError::Usage(format!(
                "no scripted tool '{name}' ([tools.scripted.{name}] in ctx.toml); scripted tools: {names}"
            )));
        }
    }
    if args.scripted.is_none() && !config.code_mode.enabled {
        return Err(CliError::Usage(
            "code mode is disabled ([code_mode] enabled = false in ctx.toml); enable it to run scripts".to_string(),
        ));
    }
    let upstreams = upstreams_of(&config, &globals.runtime);
    let kb = Kb::open(Arc::new(config)).context("cannot open the knowledge base")?;
    let registry = with_upstreams(crate::app::build(kb, None), upstreams.as_ref());
    if let Err(e) = registry.state().log.install(registry.kb().config()) {
        tracing::warn!("{e}");
    }
    let mut params = json!({ "script": script });
    if let Some(timeout) = args.timeout {
        params["timeout"] = json!(timeout);
    }
    let options = CallOptions { caller: "cli", ..Default::default() };
    let outcome = registry.call(&tool, params, &options);
    if let Some(upstreams) = &upstreams {
        globals.runtime.block_on(upstreams.shutdown());
    }
    // The entries of this command's calls are written before it exits.
    registry.state().log.shutdown();
    match outcome {
        Ok(output) if args.json => {
            println!("{}", output.rest_body());
            Ok(())
        }
        Ok(output) => {
            print_trace(&output);
            let value = output.value();
            match &value {
                Json::String(text) => println!("{text}"),
                other => println!("{}", serde_json::to_string_pretty(other).unwrap_or_default()),
            }
            Ok(())
        }
        Err(err) => {
            if !args.json {
                if let Some(trace) = err.body().data.get("data").and_then(|d| d.get("trace")) {
                    print_calls(trace);
                }
            }
            call_failed(err, args.json)
        }
    }
}

/// The inner calls, one per line on stderr: stdout keeps the result.
fn print_trace(output: &Output) {
    if let Output::Traced { trace, .. } = output {
        print_calls(trace);
        if let Some(note) = trace.get("truncated").and_then(|t| t.get("note")).and_then(Json::as_str) {
            eprintln!("note: {note}");
        }
    }
}

fn print_calls(trace: &Json) {
    for call in trace.get("calls").and_then(Json::as_array).into_iter().flatten() {
        eprintln!(
            "  {} {} {} ms, {} bytes",
            call["tool"].as_str().unwrap_or("?"),
            call["status"].as_str().unwrap_or("?"),
            call["ms"],
            call["bytes"]
        );
    }
}

/// `ctx catalog`: the catalog prompt (every reachable tool as a Lua signature).
pub fn catalog(args: CatalogArgs, globals: &Globals) -> Result<(), CliError> {
    let config = globals.load_config()?;
    let upstreams = upstreams_of(&config, &globals.runtime);
    let kb = Kb::open(Arc::new(config)).context("cannot open the knowledge base")?;
    let registry = with_upstreams(crate::app::build(kb, None), upstreams.as_ref());
    let text = crate::code::catalog_prompt(&registry, args.scripted.as_deref(), None).map_err(CliError::Usage);
    if let Some(upstreams) = &upstreams {
        globals.runtime.block_on(upstreams.shutdown());
    }
    println!("{}", text?);
    Ok(())
}
