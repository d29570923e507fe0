//! `ctx run` and `ctx catalog`: code mode from the terminal, for people writing and debugging
//! the scripts agents send. A script runs through the same registry, limits and call path as
//! `execute` over REST or MCP.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use serde_json::{json, Value as Json};

use super::running::Running;
use super::tool_cmd::{call_failed, upstreams_of, with_upstreams};
use super::{CliError, Globals};
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
    /// Run it here even when a ctx serve for this config is running (by default the script
    /// goes to it, whose upstream servers are already connected). Here, only the upstream
    /// servers the script names are started.
    #[arg(long)]
    pub local: bool,
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
    let mut params = json!({ "script": script });
    if let Some(timeout) = args.timeout {
        params["timeout"] = json!(timeout);
    }
    if !args.local {
        let remote = globals.runtime.block_on(async {
            let server = Running::find(&config).await?;
            let answer = server.call(&tool, &params).await?;
            Some((server, answer))
        });
        if let Some((server, answer)) = remote {
            tracing::info!("ran on the ctx serve at {} (--local runs it here)", server.address());
            let (status, body) = answer.map_err(|e| CliError::Failed(anyhow::anyhow!(e)))?;
            return remote_outcome(status, body, args.json);
        }
    }
    // Only the servers the script names: starting every configured one costs seconds.
    let named = named_servers(&config, &script);
    let upstreams = (!named.is_empty()).then(|| super::mcp_cmd::connect(&globals.runtime, &named));
    let kb = crate::app::database::open_kb(Arc::new(config), crate::app::database::Role::Command)?;
    let registry = with_upstreams(crate::app::build(kb, None), upstreams.as_ref());
    if let Err(e) = registry.state().log.install(registry.kb().config(), registry.state().db.as_ref()) {
        tracing::warn!("{e}");
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

/// The upstream sections whose server a script may call: those whose name, or its Lua global,
/// appears in the script as a word (`time.get_current_time`, `mcp.time`, `"time__convert"`).
/// Erring on the side of starting one too many: a server named only in a comment starts too.
fn named_servers(config: &crate::config::Config, script: &str) -> Vec<crate::config::upstream::UpstreamSection> {
    let words: std::collections::HashSet<&str> = script
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.'))
        .flat_map(|w| w.split('.'))
        .collect();
    let named = |name: &str| {
        words.contains(name)
            || words.contains(crate::code::names::lua_identifier(name).as_str())
            || script.contains(&format!("{name}__"))
    };
    config.upstreams.iter().filter(|s| named(&s.name)).cloned().collect()
}

/// The answer of the running server to `POST /tools/{tool}`, printed as a local run would be.
fn remote_outcome(status: u16, body: Json, json: bool) -> Result<(), CliError> {
    if status == 200 {
        if json {
            println!("{body}");
            return Ok(());
        }
        if let Some(trace) = body.get("trace") {
            print_calls(trace);
        }
        match body.get("result").unwrap_or(&Json::Null) {
            Json::String(text) => println!("{text}"),
            other => println!("{}", serde_json::to_string_pretty(other).unwrap_or_default()),
        }
        return Ok(());
    }
    let message = body.pointer("/error/message").and_then(Json::as_str).unwrap_or("the server answered an error");
    if json {
        println!("{body}");
    } else if let Some(trace) = body.pointer("/error/data/trace") {
        print_calls(trace);
    }
    // The script or its parameters were wrong (400, 404): a usage error, as REST says.
    match (status, json) {
        (400 | 404 | 422, false) => Err(CliError::Usage(message.to_string())),
        (400 | 404 | 422, true) => Err(CliError::Problems(message.to_string())),
        (_, false) => Err(CliError::Failed(anyhow::anyhow!(message.to_string()))),
        (_, true) => Err(CliError::Reported(message.to_string())),
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
    // The running server has every upstream connected: its catalog prompt is the same text.
    let remote = globals.runtime.block_on(async {
        let server = Running::find(&config).await?;
        let mut params = json!({"name": crate::code::PROMPT});
        if let Some(tool) = &args.scripted {
            params["arguments"] = json!({"tool": tool});
        }
        let result = server.mcp("prompts/get", params).await?;
        result.pointer("/messages/0/content/text").and_then(Json::as_str).map(str::to_string)
    });
    if let Some(text) = remote {
        println!("{text}");
        return Ok(());
    }
    let upstreams = upstreams_of(&config, &globals.runtime);
    let kb = crate::app::database::open_kb(Arc::new(config), crate::app::database::Role::Command)?;
    let registry = with_upstreams(crate::app::build(kb, None), upstreams.as_ref());
    let text = crate::code::catalog_prompt(&registry, args.scripted.as_deref(), None).map_err(CliError::Usage);
    if let Some(upstreams) = &upstreams {
        globals.runtime.block_on(upstreams.shutdown());
    }
    println!("{}", text?);
    Ok(())
}
