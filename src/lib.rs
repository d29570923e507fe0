//! # ctx
//!
//! Context and actions for AI agents: a knowledge base in SQLite, sandboxed Lua tools and agents,
//! served over MCP and REST.
//!
//! # Layout
//! Top-level modules stand on one-way floors, written down once in `src/floors.txt`: a module
//! uses only modules on lower floors, and `tests/it/floors.rs` fails the build otherwise.
//!
//! The contract (floors 0-1):
//! - [`schema`]: the JSON Schemas in `schemas/`, bundled, compiled, and worded as messages.
//! - [`types`]: Rust types generated from those schemas (the only generated code).
//! - [`runtime`]: the process's one async runtime, which the CLI builds and sync code waits on.
//! - [`contract`]: the types every feature shares (tool spec, call error, output, parameters,
//!   principal, limits, cancel and progress, redaction) and small helpers.
//! - [`db`]: the shared PostgreSQL database of replicas (`[db] url`): URL, TLS, pool, whether it
//!   answers, and versioned migrations on both backends.
//!
//! Features (floors 2-8):
//! - [`config`]: `ctx.toml` located, expanded, validated and typed (data only).
//! - [`lua`]: the sandbox (the only place a Lua state is created) and its host APIs.
//! - [`embed`]: embedding providers (a local static or transformer model, Ollama, OpenAI) for
//!   semantic search.
//! - [`approval`]: which tool calls wait for a person, and the check before they run.
//! - [`calllog`]: the tool-call log, written in the background beside the knowledge base.
//! - [`chat`]: the language model behind the console's chat (`[chat]`): one turn per request.
//! - [`tasks`]: calls that run on as tasks: their bookkeeping, the store that keeps them, and
//!   each caller's cap (running one is the pipeline's).
//! - [`packs`]: tool packs: `pack.toml` manifests, install from a folder, git or a registry into
//!   `packs/`, `ctx.lock`, and the check at load that refuses a pack whose files changed.
//! - [`upstream`]: the gateway's supervised client connection to each upstream MCP server.
//! - [`connectors`]: filesystem, git and Lua sources that feed sync.
//! - [`kb`]: the SQLite store, chunking, sync and search, and the background filler of vectors.
//! - [`metrics`]: counters and histograms of calls, served as Prometheus text.
//! - [`tools`]: the tool registry (the catalog of tools and agents) and the one call pipeline
//!   every call enters (admission, policy, observation, execution); built-ins, Lua tools,
//!   upstream tools, scoped tokens, rate limits; the `Tool` and `Agent` traits; the state one
//!   application's calls share (`CallState`).
//! - [`agents`]: inline and Lua agents, resolved into prompts.
//! - [`code`]: code mode: one agent-sent Lua script that calls many tools (`execute`, scripted
//!   tools, discovery).
//!
//! Assembly (floor 9):
//! - [`app`]: the registry built from a config (Lua tools, agents, code mode's tools), the check
//!   of a config's scripts, and hot reload.
//!
//! Adapters (floors 10-12):
//! - [`mcp`]: MCP over rmcp (Streamable HTTP in both eras, and stdio).
//! - [`server`]: the HTTP server: REST, `/mcp`, the OpenAPI document and Swagger UI, limits.
//! - [`cli`]: the `ctx` command line.

/// mimalloc instead of the system allocator: ctx's calls allocate and free many small values on
/// one thread that another thread made (a script's arguments, a tool's result), which glibc
/// pays for with arena locks and consolidation passes. Here, for the binary, tests and benches.
#[global_allocator]
// Static: the allocator of the process; it holds no state of any application.
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod agents;
pub mod app;
pub mod approval;
pub mod calllog;
pub mod chat;
pub mod cli;
pub mod code;
pub mod config;
pub mod connectors;
pub mod contract;
pub mod db;
pub mod embed;
pub mod kb;
pub mod lua;
pub mod mcp;
pub mod metrics;
pub mod packs;
pub mod runtime;
pub mod schema;
pub mod server;
pub mod tasks;
pub mod tools;
pub mod types;
pub mod upstream;
