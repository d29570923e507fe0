//! Embedding providers: texts in, unit vectors out, for semantic and hybrid search.
//!
//! One trait, three providers: `local` (a static model read from disk, in process, never on
//! the network), `ollama` and `openai` (any OpenAI-compatible `/embeddings`). The knowledge
//! base only sees [`Embedder`]: sync embeds new chunks with it, search embeds the query.

use std::sync::Arc;

use crate::config::Config;

mod http;
mod local;
mod ollama;
mod openai;
mod remote;
mod transformer;

pub use local::{default_model_dirs, load as load_local, StaticModel, DEFAULT_MODEL};

/// Turns texts into L2-normalised vectors of [`Embedder::dims`] dimensions.
pub trait Embedder: Send + Sync {
    /// The name stored vectors are tagged with: the provider and the model, as
    /// `local:wordllama-l2-256` or `ollama:nomic-embed-text`. A change of name re-embeds.
    fn name(&self) -> &str;
    /// Dimensions of every vector.
    fn dims(&self) -> usize;
    /// One unit vector per text, in order (a text with no known token gets the zero vector).
    /// Network providers batch, retry and time out inside this call.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError>;
    /// Whether one call may wait on the network (so a caller on an async worker moves it to a
    /// blocking thread first).
    fn remote(&self) -> bool {
        true
    }
    /// Hybrid search's semantic weight when `[retrieval] hybrid_weight` is unset: how far this
    /// model's list is trusted against keyword search's. 0.3 was chosen for the static model
    /// on the Debian quality set; a model not measured there gets the same.
    fn hybrid_weight(&self) -> f64 {
        0.3
    }
    /// Whether sync leaves this model's vectors to the background when `[embedding] background`
    /// is unset: a model too slow to embed as fast as keyword indexing goes.
    fn background_by_default(&self) -> bool {
        false
    }
    /// Whether one call already uses every core (a transformer's matrix products): then callers
    /// do not split a batch across threads of their own.
    fn parallel_inside(&self) -> bool {
        false
    }
}

/// Errors of the embedding layer. Each names the provider and what to do.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// The local model's files are missing or malformed.
    #[error("cannot load the local embedding model at {path}: {message}")]
    Load { path: String, message: String },
    /// A provider answered with an error, or not at all, after its retries.
    #[error("embedding with {provider} failed: {message}")]
    Provider { provider: String, message: String },
    /// The configuration cannot work (no model for a service, dims that do not fit).
    #[error("[embedding] {0}")]
    Config(String),
}

/// The embedder `config` asks for, or `None` when `[embedding] provider` is `disabled`.
/// A local model is read from disk here (tens of milliseconds); services are not contacted.
pub fn from_config(config: &Config) -> Result<Option<Arc<dyn Embedder>>, EmbedError> {
    use crate::types::EmbeddingConfigProvider as Provider;
    let spec = &config.spec.embedding;
    Ok(match spec.provider {
        Provider::Disabled => None,
        Provider::Local => Some(local::from_config(config)?),
        // Both are one remote endpoint; their modules hold what differs (paths, wire formats,
        // advice). Neither is contacted until the first `embed`.
        Provider::Ollama => Some(Arc::new(remote::Remote::from_config(spec, &ollama::SERVICE)?)),
        Provider::Openai => Some(Arc::new(remote::Remote::from_config(spec, &openai::SERVICE)?)),
    })
}

/// Scales `v` to unit length in place; the zero vector stays zero.
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}
