//! The `openai` provider: any OpenAI-compatible `POST {url}/embeddings`, with `{"model",
//! "input": [texts]}` and a bearer key, answered by `{"data": [{"index", "embedding"}, ...]}`.
//!
//! `dimensions` is sent only for `text-embedding-3*` models: they are the OpenAI models that
//! can shorten their vectors, and other servers (and older models) may refuse the field. For
//! the rest, `dims` is only checked against the answer.

use serde_json::json;

use super::http::{Service, Trouble};

pub(super) const SERVICE: Service = Service {
    provider: "openai",
    default_url: "https://api.openai.com/v1",
    path: "embeddings",
    example: ("text-embedding-3-small", 1536),
    request,
    vectors,
    error_of,
    advice,
};

fn request(model: &str, dims: usize, texts: &[&str]) -> serde_json::Value {
    let mut body = json!({ "model": model, "input": texts });
    if model.starts_with("text-embedding-3") {
        body["dimensions"] = json!(dims);
    }
    body
}

/// The vectors in input order. The API numbers each one with `index`; the array's own order is
/// not promised, so it is not trusted.
fn vectors(answer: &[u8]) -> Result<Vec<Vec<f32>>, String> {
    #[derive(serde::Deserialize)]
    struct Answer {
        data: Vec<Item>,
    }
    #[derive(serde::Deserialize)]
    struct Item {
        index: Option<usize>,
        embedding: Vec<f32>,
    }
    let answer: Answer = serde_json::from_slice(answer).map_err(|e| {
        format!(
            "the answer is not {{\"data\": [{{\"index\": i, \"embedding\": [numbers]}}, ...]}} ({e}); \
             is url an OpenAI-compatible API (the base URL, ending in /v1)?"
        )
    })?;
    let count = answer.data.len();
    let mut slots: Vec<Option<Vec<f32>>> = vec![None; count];
    for (position, item) in answer.data.into_iter().enumerate() {
        // A server that leaves `index` out answers in order; one that sets it is followed.
        let index = item.index.unwrap_or(position);
        match slots.get_mut(index) {
            Some(slot @ None) => *slot = Some(item.embedding),
            Some(Some(_)) => return Err(format!("the answer gives index {index} twice")),
            None => return Err(format!("the answer gives index {index} for {count} vectors")),
        }
    }
    // Every slot is filled: `count` distinct indices below `count`.
    Ok(slots.into_iter().flatten().collect())
}

/// OpenAI says `{"error": {"message": "..."}}`; some compatible servers `{"error": "..."}`.
fn error_of(answer: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(answer).ok()?;
    let error = value.get("error")?;
    error.get("message").and_then(|m| m.as_str()).or_else(|| error.as_str()).map(str::to_string)
}

fn advice(trouble: Trouble, model: &str) -> String {
    match trouble {
        Trouble::Unreachable => "check [embedding] url and the network".to_string(),
        Trouble::Timeout => "raise [embedding] timeout_secs or lower batch_size".to_string(),
        Trouble::Status(401 | 403) => {
            "check [embedding] api_key (or the environment variable its ${VAR} names)".to_string()
        }
        Trouble::Status(404) => format!(
            "model {model} not found, or url is not the API's base URL (it ends in /v1): check [embedding] model and url"
        ),
        Trouble::Status(400 | 422) => "check [embedding] model and dims, and the service's message".to_string(),
        Trouble::Status(429) => "rate limited: lower batch_size, raise your quota, or try again later".to_string(),
        Trouble::Status(_) => "the service failed: try again later".to_string(),
    }
}
