//! The `ollama` provider: `POST {url}/api/embed` with `{"model", "input": [texts]}`, answered
//! by `{"embeddings": [[...], ...]}` in the order of the inputs.

use serde_json::json;

use super::http::{Service, Trouble};

pub(super) const SERVICE: Service = Service {
    provider: "ollama",
    default_url: "http://127.0.0.1:11434",
    path: "api/embed",
    example: ("nomic-embed-text", 768),
    request,
    vectors,
    error_of,
    advice,
};

fn request(model: &str, _dims: usize, texts: &[&str]) -> serde_json::Value {
    // Ollama truncates an input past the model's context by default, which is what a chunk
    // that happens to be long wants.
    json!({ "model": model, "input": texts })
}

fn vectors(answer: &[u8]) -> Result<Vec<Vec<f32>>, String> {
    #[derive(serde::Deserialize)]
    struct Answer {
        embeddings: Vec<Vec<f32>>,
    }
    serde_json::from_slice::<Answer>(answer)
        .map(|a| a.embeddings)
        .map_err(|e| format!("the answer is not {{\"embeddings\": [[numbers], ...]}} ({e}); is url an Ollama server?"))
}

/// Ollama says `{"error": "..."}`.
fn error_of(answer: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(answer).ok()?;
    value.get("error")?.as_str().map(str::to_string)
}

fn advice(trouble: Trouble, model: &str) -> String {
    match trouble {
        Trouble::Unreachable => {
            "is Ollama running? Start it with `ollama serve`, or set [embedding] url to where it listens".to_string()
        }
        Trouble::Timeout => "Ollama may still be loading the model: raise [embedding] timeout_secs or lower batch_size"
            .to_string(),
        Trouble::Status(404) => format!("the model may not be pulled: run `ollama pull {model}`"),
        Trouble::Status(400) => format!("check that {model} is an embedding model (e.g. nomic-embed-text)"),
        Trouble::Status(401 | 403) => {
            "a proxy in front of Ollama refused the request: check [embedding] api_key (or the variable its ${VAR} names)"
                .to_string()
        }
        Trouble::Status(429) => "Ollama is overloaded: lower batch_size or try again later".to_string(),
        Trouble::Status(_) => "see Ollama's log (`journalctl -u ollama` or the `ollama serve` terminal)".to_string(),
    }
}
