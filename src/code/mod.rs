//! Code mode: one agent-sent Lua script that calls many tools in one round trip (seeds 001 and
//! 002). The `execute` built-in, the discovery tools, and scripted tools all run scripts here,
//! and every inner call goes through the registry's one call path.

pub mod catalog;
pub mod names;
pub mod outcome;
pub mod calls;
