//! The knowledge base: SQLite store, chunking, sync and search.

pub mod chunk;
