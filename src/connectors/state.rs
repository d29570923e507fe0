//! What a script connector keeps between syncs (its last success and key-value state), and
//! the bounds a script's state must keep. The knowledge base stores it (`kb::connector_state`).

use serde_json::{Map, Value};

/// The most bytes of JSON one source's state may hold: cursors and ids, not documents.
pub const MAX_BYTES: usize = 64 * 1024;

/// The most bytes of one key.
pub const MAX_KEY_BYTES: usize = 256;

/// What the last successful sync of a source left for the next one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Saved {
    /// When the last successful sync started (RFC 3339, UTC); `None` before the first one.
    pub last_success: Option<String>,
    /// The script's key-value state.
    pub values: Map<String, Value>,
}
