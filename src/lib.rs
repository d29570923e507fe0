//! # ctx
//!
//! Context and actions for AI agents: a knowledge base in SQLite, sandboxed Lua tools and agents,
//! served over MCP and REST.
//!
//! # Layout
//! The contract:
//! - [`schema`]: the JSON Schemas in `schemas/`, bundled, compiled, and worded as messages.
//! - [`types`]: Rust types generated from those schemas (the only generated code).
//! - [`config`]: `ctx.toml` located, expanded, validated and typed.
//!
//! The knowledge base:
//! - [`connectors`]: filesystem, git and Lua sources that feed sync.
//! - [`embed`]: embedding providers (the local static model, Ollama, OpenAI) for semantic search.
//! - [`kb`]: the SQLite store, chunking, sync and search.
//!
//! Scripts and calls:
//! - [`lua`]: the sandbox (the only place a Lua state is created) and its host APIs.
//! - [`tools`]: the tool registry and the call path every call takes: built-ins, Lua tools,
//!   upstream tools, scoped tokens, rate limits.
//! - [`agents`]: inline and Lua agents, resolved into prompts.
//! - [`code`]: code mode: one agent-sent Lua script that calls many tools (`execute`, scripted
//!   tools, discovery).
//! - [`upstream`]: the gateway's supervised client connection to each upstream MCP server.
//! - [`approval`]: which tool calls wait for a person, and the check before they run.
//! - [`calllog`]: the tool-call log, written in the background beside the knowledge base.
//! - [`metrics`]: counters and histograms of calls, served as Prometheus text.
//!
//! Adapters:
//! - [`mcp`]: MCP over rmcp (Streamable HTTP in both eras, and stdio).
//! - [`server`]: the HTTP server: REST, `/mcp`, the OpenAPI document and Swagger UI, limits.
//! - [`cli`]: the `ctx` command line.
//! - [`runtime`]: the process's one async runtime, which the CLI builds and sync code waits on.

/// mimalloc instead of the system allocator: ctx's calls allocate and free many small values on
/// one thread that another thread made (a script's arguments, a tool's result), which glibc
/// pays for with arena locks and consolidation passes. Here, for the binary, tests and benches.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod agents;
pub mod app;
pub mod approval;
pub mod calllog;
pub mod cli;
pub mod code;
pub mod config;
pub mod connectors;
pub mod contract;
pub mod embed;
pub mod kb;
pub mod lua;
pub mod mcp;
pub mod metrics;
pub mod runtime;
pub mod schema;
pub mod server;
pub mod tools;
pub mod types;
pub mod upstream;
