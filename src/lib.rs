//! # ctx
//!
//! Context and actions for AI agents: a knowledge base in SQLite, sandboxed Lua tools and agents,
//! served over MCP and REST.
//!
//! # Layout
//! - [`schema`]: the JSON Schemas in `schemas/`, bundled, compiled, and worded as messages.
//! - [`types`]: Rust types generated from those schemas (the only generated code).
//! - [`config`]: `ctx.toml` located, expanded, validated and typed.
//! - [`connectors`]: filesystem and git sources that feed sync.
//! - [`kb`]: the SQLite store, chunking, sync and search.
//! - [`metrics`]: counters and histograms of calls, served as Prometheus text.
//! - [`lua`]: the sandbox (the only place a Lua state is created) and its host APIs.
//! - [`approval`]: which tool calls wait for a person, and the check before they run.
//! - [`calllog`]: the tool-call log, written in the background beside the knowledge base.
//! - [`cli`]: the `ctx` command line.

/// mimalloc instead of the system allocator: ctx's calls allocate and free many small values on
/// one thread that another thread made (a script's arguments, a tool's result), which glibc
/// pays for with arena locks and consolidation passes. Here, for the binary, tests and benches.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod agents;
pub mod approval;
pub mod calllog;
pub mod cli;
pub mod code;
pub mod config;
pub mod connectors;
pub mod embed;
pub mod kb;
pub mod lua;
pub mod mcp;
pub mod metrics;
pub mod schema;
pub mod server;
pub mod tools;
pub mod types;
pub mod upstream;
