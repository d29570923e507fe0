//! The embedder half the network providers share: settings read from `[embedding]`, batching,
//! and the checks every answer must pass before a vector reaches the index.

use std::sync::Arc;
use std::time::Duration;

use super::http::{Endpoint, Service};
use super::{normalize, EmbedError, Embedder};
use crate::config::redact::Redactor;
use crate::types::EmbeddingConfig;

/// The smallest answer size cap, whatever batch_size × dims says.
const MIN_ANSWER_CAP: usize = 64 << 20;
/// Bytes one number may take in a JSON answer, generously (`-0.012345678901234567,`).
const BYTES_PER_NUMBER: usize = 32;

/// A service-backed embedder: one [`Endpoint`] and the shape its vectors must have.
pub struct Remote {
    endpoint: Arc<Endpoint>,
    dims: usize,
    batch_size: usize,
}

impl Remote {
    /// Reads `spec` for `service`. `model` and `dims` are required: the model is what the
    /// service is asked for, and `dims` must be known before the first call, since the index
    /// is laid out (and old vectors judged) by it.
    pub fn from_config(spec: &EmbeddingConfig, service: &'static Service) -> Result<Self, EmbedError> {
        let provider = service.provider;
        let (example_model, example_dims) = service.example;
        let Some(model) = spec.model.as_ref().map(|m| m.to_string()) else {
            return Err(EmbedError::Config(format!(
                "provider \"{provider}\" needs `model`, the name the service knows it by \
                 (e.g. model = \"{example_model}\")"
            )));
        };
        let Some(dims) = spec.dims.map(|d| d as usize).filter(|&d| d > 0) else {
            return Err(EmbedError::Config(format!(
                "provider \"{provider}\" needs `dims`: set dims = N, the model's vector size \
                 (e.g. {example_dims} for {example_model})"
            )));
        };
        let base = spec.url.as_ref().map(|u| u.to_string()).unwrap_or_else(|| service.default_url.to_string());
        let mut secrets = Redactor::default();
        let api_key = spec.api_key.clone().filter(|k| !k.is_empty());
        if let Some(key) = &api_key {
            secrets.add(key, "embedding.api_key");
        }
        let url = endpoint_url(&base, service.path).map_err(|why| {
            EmbedError::Config(secrets.apply(&format!("url = \"{base}\" is not a URL ({why})")).into_owned())
        })?;
        let mut shown = url.clone();
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        let batch_size = (spec.batch_size as usize).max(1);
        let endpoint = Endpoint {
            service,
            name: format!("{provider}:{model}"),
            model,
            shown: shown.to_string(),
            url,
            api_key,
            timeout: Duration::from_secs(spec.timeout_secs.max(1)),
            max_retries: spec.max_retries.clamp(0, 100) as u32,
            max_answer: MIN_ANSWER_CAP.max(batch_size.saturating_mul(dims).saturating_mul(BYTES_PER_NUMBER)),
            secrets,
        };
        Ok(Remote { endpoint: Arc::new(endpoint), dims, batch_size })
    }
}

impl Embedder for Remote {
    fn name(&self) -> &str {
        &self.endpoint.name
    }

    fn dims(&self) -> usize {
        self.dims
    }

    /// One checked unit vector per text, in order. Blank texts get the zero vector without a
    /// request (some services refuse an empty input), as the local model gives a text it
    /// cannot read.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut out = vec![Vec::new(); texts.len()];
        let wanted: Vec<usize> = (0..texts.len()).filter(|&i| !texts[i].trim().is_empty()).collect();
        for batch in wanted.chunks(self.batch_size) {
            let inputs: Vec<&str> = batch.iter().map(|&i| texts[i]).collect();
            let vectors = self.embed_batch(&inputs)?;
            for (&i, vector) in batch.iter().zip(vectors) {
                out[i] = vector;
            }
        }
        for vector in out.iter_mut().filter(|v| v.is_empty()) {
            *vector = vec![0.0; self.dims];
        }
        Ok(out)
    }
}

impl Remote {
    fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let service = self.endpoint.service;
        let body = (service.request)(&self.endpoint.model, self.dims, texts);
        let body = serde_json::to_vec(&body).map_err(|e| self.endpoint.fail(&e.to_string()))?;
        let answer = self.endpoint.post(body)?;
        let mut vectors = (service.vectors)(&answer).map_err(|why| self.endpoint.fail(&why))?;
        self.check(texts.len(), &vectors).map_err(|why| self.endpoint.fail(&why))?;
        vectors.iter_mut().for_each(|v| normalize(v));
        Ok(vectors)
    }

    /// A wrong answer must never reach the index: a short or misaligned batch would pair
    /// chunks with other chunks' vectors.
    fn check(&self, asked: usize, vectors: &[Vec<f32>]) -> Result<(), String> {
        if vectors.len() != asked {
            return Err(format!(
                "asked for {asked} vectors and got {}; the service answered out of protocol, nothing was stored",
                vectors.len()
            ));
        }
        for (i, vector) in vectors.iter().enumerate() {
            if vector.len() != self.dims {
                return Err(format!(
                    "vector {i} has {} dimensions but [embedding] dims = {}: set dims to the model's vector size \
                     (or use a model with {} dimensions)",
                    vector.len(),
                    self.dims,
                    self.dims
                ));
            }
            // The JSON parser already refuses numbers beyond f32; this keeps NaN out of the
            // index whatever a future wire format allows.
            if vector.iter().any(|x| !x.is_finite()) {
                return Err(format!("vector {i} holds a number that is not finite; nothing was stored"));
            }
        }
        Ok(())
    }
}

/// `base` joined with `path`, unless `base` already ends with it (a user who pasted the full
/// endpoint URL).
fn endpoint_url(base: &str, path: &str) -> Result<reqwest::Url, String> {
    let base = base.trim_end_matches('/');
    let full = if base.ends_with(&format!("/{path}")) { base.to_string() } else { format!("{base}/{path}") };
    let url = reqwest::Url::parse(&full).map_err(|e| e.to_string())?;
    match url.scheme() {
        "http" | "https" => Ok(url),
        other => Err(format!("scheme {other} is not http or https")),
    }
}

#[cfg(test)]
mod tests {
    use super::endpoint_url;

    #[test]
    fn endpoint_url_joins_once() {
        let join = |b: &str, p: &str| endpoint_url(b, p).unwrap().to_string();
        assert_eq!(join("http://127.0.0.1:11434", "api/embed"), "http://127.0.0.1:11434/api/embed");
        assert_eq!(join("http://h/v1/", "embeddings"), "http://h/v1/embeddings");
        assert_eq!(join("http://h/v1/embeddings", "embeddings"), "http://h/v1/embeddings");
        assert!(endpoint_url("ftp://h", "embeddings").is_err());
    }
}
