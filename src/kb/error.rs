//! Errors of the knowledge-base layer. No HTTP or CLI knowledge here.

#[derive(Debug, thiserror::Error)]
pub enum KbError {
    #[error("the search query is empty; give at least one word to look for")]
    EmptyQuery,
    #[error("the query {0:?} has no searchable words: keyword search matches words of letters or digits and ignores symbols and emoji; add a word, or use semantic search")]
    NoWords(String),
    #[error("semantic search needs an embedding provider: add [embedding] provider = \"local\" and path = \"<model folder>\" to ctx.toml (scripts/get-model installs one), or provider = \"ollama\" / \"openai\" with model and dims; then run `ctx embed`. Keyword and hybrid search work without one")]
    SemanticUnavailable,
    /// The embedding provider failed, or cannot be set up.
    #[error("{0}")]
    Embed(String),
    #[error("unknown source {given:?}; known sources: {}", if known.is_empty() { "none yet (run `ctx sync`)".to_string() } else { known.join(", ") })]
    UnknownSource { given: String, known: Vec<String> },
    #[error("unknown sync target {given:?}; use all, filesystem, git, script, or one of: {}", if known.is_empty() { "(no sources configured)".to_string() } else { known.join(", ") })]
    UnknownTarget { given: String, known: Vec<String> },
    #[error("invalid date {0:?}: expected YYYY-MM-DD or an RFC 3339 timestamp such as 2026-01-31T12:00:00Z")]
    BadDate(String),
    #[error("limit {given} is out of range: expected 1 to {max} ([retrieval] max_limit)")]
    BadLimit { given: i64, max: i64 },
    #[error("no document with id {0:?}")]
    NotFound(String),
    #[error("cannot open the database at {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("the database at {path} was written by a newer ctx (schema version {found}, this build knows {known}); upgrade ctx")]
    TooNew { path: String, found: i64, known: i64 },
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The shared database (`[db] url`) failed or is away.
    #[error("{0}")]
    Database(crate::db::DbError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl KbError {
    /// Whether the request was wrong (an empty query, an unknown source, a bad date or limit),
    /// rather than the knowledge base: `bad_request` for a call, a usage error for the CLI.
    pub fn is_callers_mistake(&self) -> bool {
        matches!(
            self,
            KbError::EmptyQuery
                | KbError::NoWords(_)
                | KbError::SemanticUnavailable
                | KbError::UnknownSource { .. }
                | KbError::UnknownTarget { .. }
                | KbError::BadDate(_)
                | KbError::BadLimit { .. }
        )
    }
}

/// What a knowledge-base error means for a call: said here, since the contract's
/// [`CallError`](crate::contract::CallError) knows nothing of the knowledge base.
impl crate::contract::CallError {
    /// Maps a knowledge-base error: the caller's mistakes are `bad_request`, the rest internal.
    pub fn from_kb(err: KbError) -> Self {
        match err {
            KbError::NotFound(_) => Self::NotFound(err.to_string()),
            KbError::Embed(_) => Self::Unavailable(err.to_string()),
            KbError::Database(ref e) if e.is_unavailable() => Self::Unavailable(err.to_string()),
            _ if err.is_callers_mistake() => Self::BadRequest(err.to_string()),
            // A budgeted inline query that ran out of time: the call runs again on the pool.
            KbError::Sqlite(ref e) if super::budget::is_interrupt(e) => {
                Self::Internal("the query was interrupted".into())
            }
            other => {
                tracing::error!("knowledge base error: {other}");
                Self::Internal("the knowledge base failed to answer; the server log has the details".into())
            }
        }
    }
}
