//! The resource limits of one script run.

use std::time::Duration;

/// Resource limits of one script run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub timeout: Duration,
    pub memory_bytes: usize,
    pub max_result_bytes: usize,
}

impl Limits {
    /// The default memory (64 MiB) and result (4 MiB) limits with `timeout`.
    pub fn with_timeout(timeout: Duration) -> Self {
        Limits { timeout, memory_bytes: 64 * 1024 * 1024, max_result_bytes: 4 * 1024 * 1024 }
    }
}
