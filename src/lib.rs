pub mod config;
pub mod schema;
pub mod types;
