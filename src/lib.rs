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
//! - [`lua`]: the sandbox (the only place a Lua state is created) and its host APIs.
//! - [`cli`]: the `ctx` command line.

pub mod agents;
pub mod cli;
pub mod code;
pub mod config;
pub mod connectors;
pub mod embed;
pub mod kb;
pub mod lua;
pub mod mcp;
pub mod schema;
pub mod server;
pub mod tools;
pub mod types;
pub mod upstream;
