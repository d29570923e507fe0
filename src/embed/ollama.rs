//! The `ollama` provider (being built).

use super::{EmbedError, Embedder};
use crate::types::EmbeddingConfig;

pub struct Ollama {
    name: String,
    dims: usize,
}

impl Ollama {
    pub fn from_config(_spec: &EmbeddingConfig) -> Result<Self, EmbedError> {
        Err(EmbedError::Config("provider \"ollama\" is not available in this build yet".to_string()))
    }
}

impl Embedder for Ollama {
    fn name(&self) -> &str {
        &self.name
    }
    fn dims(&self) -> usize {
        self.dims
    }
    fn embed(&self, _texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Err(EmbedError::Provider { provider: "ollama".to_string(), message: "not available yet".to_string() })
    }
}
