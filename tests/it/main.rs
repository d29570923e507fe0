//! Integration tests: one binary, one module per area. They run the real `ctx` binary and open
//! real SQLite files, folders and git repositories created in temporary directories.
mod agents;
mod cli;
mod clients;
mod common;
mod config_17;
mod config_loading;
mod fault_upstream;
mod gateway;
mod gateway_runtime;
mod hardening_egress;
mod hardening_scripts;
mod hardening_server;
mod http;
mod kb;
mod limits;
mod link_order;
mod mcp;
mod proof;
mod real_upstreams;
mod review_16;
mod review_17;
mod sandbox;
mod schemas;
mod scripting;
mod tools;
mod wire;
