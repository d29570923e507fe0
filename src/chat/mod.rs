//! The language model behind the console's chat (`[chat]`, `POST /chat`): one request per turn
//! to an OpenAI-compatible API or Ollama, with the tools the caller may use.
//!
//! ctx does not run the conversation's tool calls here: it answers the model's message, and the
//! caller runs each call through the one call path (`POST /tools/{name}`), where its token,
//! approvals, rates and the call log apply as to any call. The key stays on the server.
//!
//! Model-facing tool names must match `^[A-Za-z0-9_-]{1,64}$`; ctx's names may hold dots and
//! be longer, so each offered tool gets a name that fits, mapped back on the way out.

mod wire;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value as Json};

use crate::config::redact::Redactor;
use crate::types::{ChatConfig, ChatConfigProvider, ChatMessage, ChatMessageRole, ChatToolCall};

/// The largest model answer read; a chat message is far smaller.
const MAX_ANSWER: usize = 8 << 20;

/// Why a turn failed.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// `[chat]` cannot be used as written.
    #[error("[chat]: {0}")]
    Config(String),
    /// The conversation sent is not one the model can take.
    #[error("{0}")]
    Request(String),
    /// The model's service failed, refused, or answered something that is not a message.
    #[error("{0}")]
    Model(String),
}

/// A tool offered to the model.
#[derive(Clone, Debug)]
pub struct Offer {
    pub name: String,
    pub description: String,
    pub parameters: Json,
}

/// One `[chat]` section, ready to ask.
pub struct Chat {
    provider: ChatConfigProvider,
    model: String,
    endpoint: reqwest::Url,
    api_key: Option<String>,
    system: Option<String>,
    timeout: Duration,
    max_tools: usize,
    secrets: Redactor,
}

impl Chat {
    pub fn from_config(spec: &ChatConfig) -> Result<Chat, ChatError> {
        let (default_url, path) = match spec.provider {
            ChatConfigProvider::Openai => ("https://api.openai.com/v1", "chat/completions"),
            ChatConfigProvider::Ollama => ("http://127.0.0.1:11434", "api/chat"),
        };
        let mut secrets = Redactor::default();
        let api_key = spec.api_key.clone().filter(|k| !k.is_empty());
        if let Some(key) = &api_key {
            secrets.add(key, "chat.api_key");
        }
        let base = spec.url.as_ref().map(|u| u.to_string()).unwrap_or_else(|| default_url.to_string());
        let mut base = reqwest::Url::parse(&base).map_err(|e| {
            // A URL with credentials in it is not quoted: this message reaches every token.
            let shown = if base.contains('@') { String::new() } else { format!(" \"{base}\"") };
            ChatError::Config(secrets.apply(&format!("url{shown} is not a URL ({e})")).into_owned())
        })?;
        if !base.path().ends_with('/') {
            let with_slash = format!("{}/", base.path());
            base.set_path(&with_slash);
        }
        let mut endpoint = base.join(path).map_err(|e| ChatError::Config(format!("url: {e}")))?;
        // A query on the base URL (an API version, say) applies to the endpoint too.
        endpoint.set_query(base.query());
        Ok(Chat {
            provider: spec.provider,
            model: spec.model.to_string(),
            endpoint,
            api_key,
            system: spec.system.as_ref().map(|s| s.to_string()).filter(|s| !s.trim().is_empty()),
            timeout: Duration::from_secs(spec.timeout_secs.max(1)),
            max_tools: spec.max_tools as usize,
            secrets,
        })
    }

    pub fn provider(&self) -> &'static str {
        match self.provider {
            ChatConfigProvider::Openai => "openai",
            ChatConfigProvider::Ollama => "ollama",
        }
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// The tools the model is offered of `tools`: the first `max_tools` by name.
    pub fn offered<'a>(&self, tools: &'a [Offer]) -> Vec<&'a Offer> {
        let mut sorted: Vec<&Offer> = tools.iter().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        sorted.truncate(self.max_tools);
        sorted
    }

    /// The model's next message after `messages`, offered `tools`.
    pub async fn answer(&self, messages: &[ChatMessage], tools: &[Offer]) -> Result<ChatMessage, ChatError> {
        check(messages)?;
        let offered = self.offered(tools);
        let names = Names::new(offered.iter().map(|t| t.name.as_str()));
        let mut all = Vec::with_capacity(messages.len() + 1);
        if let Some(system) = &self.system {
            all.push(ChatMessage {
                role: ChatMessageRole::System,
                content: Some(system.clone()),
                tool_calls: Vec::new(),
                tool_call_id: None,
            });
        }
        all.extend(messages.iter().cloned());
        let body = match self.provider {
            ChatConfigProvider::Openai => wire::openai_request(&self.model, &all, &offered, &names),
            ChatConfigProvider::Ollama => wire::ollama_request(&self.model, &all, &offered, &names),
        };
        let answer = self.post(&body).await?;
        let message = match self.provider {
            ChatConfigProvider::Openai => wire::openai_answer(&answer, &names),
            ChatConfigProvider::Ollama => wire::ollama_answer(&answer, &names),
        };
        message.map_err(|why| ChatError::Model(format!("the model's answer is not a chat message: {why}")))
    }

    async fn post(&self, body: &Json) -> Result<Json, ChatError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .user_agent(concat!("ctx/", env!("CARGO_PKG_VERSION")))
            .timeout(self.timeout)
            .connect_timeout(Duration::from_secs(10))
            // A redirected POST could carry the key elsewhere; a proxy from the environment
            // would see it and the conversation.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .map_err(|e| ChatError::Model(format!("cannot build the HTTP client: {e}")))?;
        let mut request = client.post(self.endpoint.clone()).json(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let shown = self.shown();
        let mut response = request.send().await.map_err(|e| {
            let why = if e.is_timeout() {
                format!("the model did not answer within {} s (chat.timeout_secs)", self.timeout.as_secs())
            } else {
                format!("cannot reach the model at {shown}: {}", root_cause(&e))
            };
            ChatError::Model(self.redact(&why))
        })?;
        let status = response.status();
        let mut bytes = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) if bytes.len() + chunk.len() > MAX_ANSWER => {
                    return Err(ChatError::Model(format!(
                        "the model's answer is larger than {} MiB; is chat.url a chat API?",
                        MAX_ANSWER >> 20
                    )));
                }
                Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(e) if e.is_timeout() => {
                    let why =
                        format!("the model did not answer within {} s (chat.timeout_secs)", self.timeout.as_secs());
                    return Err(ChatError::Model(why));
                }
                Err(e) => {
                    let why = format!("the model's answer broke off: {}", root_cause(&e));
                    return Err(ChatError::Model(self.redact(&why)));
                }
            }
        }
        let parsed: Option<Json> = serde_json::from_slice(&bytes).ok();
        if !status.is_success() {
            let why = match status.as_u16() {
                // What a service says about a refused key may quote the key, whole or in part
                // or encoded: not passed on.
                401 | 403 => format!("the model at {shown} refused the request ({status}): check chat.api_key"),
                code => {
                    // Redacted whole, then cut: a cut could leave part of a secret unmatched.
                    let said = parsed
                        .as_ref()
                        .and_then(service_message)
                        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).trim().to_string());
                    let said: String = self.redact(&said).chars().take(500).collect();
                    let hint = match code {
                        404 => " (check chat.url and chat.model)",
                        429 => " (the service's rate limit; try again later)",
                        _ => "",
                    };
                    format!("the model at {shown} answered {status}: {said}{hint}")
                }
            };
            return Err(ChatError::Model(self.redact(&why)));
        }
        parsed.ok_or_else(|| ChatError::Model(format!("the model at {shown} answered something that is not JSON")))
    }

    /// `text` without the key, or any secret of the config.
    fn redact(&self, text: &str) -> String {
        crate::contract::redact::text(&self.secrets.apply(text)).into_owned()
    }

    /// The endpoint without credentials, for messages.
    fn shown(&self) -> String {
        let mut shown = self.endpoint.clone();
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        shown.set_query(None);
        shown.to_string()
    }
}

/// What the API's error body says: OpenAI's `{"error": {"message"}}`, Ollama's `{"error": "..."}`.
fn service_message(body: &Json) -> Option<String> {
    let error = body.get("error")?;
    let text = error.get("message").and_then(Json::as_str).or_else(|| error.as_str())?;
    Some(text.to_string())
}

fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause: &dyn std::error::Error = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// Checks the conversation's shape beyond what its schema says: tool calls only on an
/// assistant's message, each tool message answering a call made before it.
fn check(messages: &[ChatMessage]) -> Result<(), ChatError> {
    let mut asked: Vec<&str> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        if !m.tool_calls.is_empty() && m.role != ChatMessageRole::Assistant {
            return Err(ChatError::Request(format!("messages[{i}]: only an assistant message has tool_calls")));
        }
        asked.extend(m.tool_calls.iter().map(|c| c.id.as_str()));
        match (m.role, m.tool_call_id.as_deref()) {
            (ChatMessageRole::Tool, None) => {
                return Err(ChatError::Request(format!(
                    "messages[{i}]: a tool message needs tool_call_id, the id of the call it answers"
                )))
            }
            (ChatMessageRole::Tool, Some(id)) if !asked.contains(&id) => {
                return Err(ChatError::Request(format!(
                    "messages[{i}]: tool_call_id {id:?} answers no tool call of an earlier assistant message"
                )))
            }
            (ChatMessageRole::Tool, _) => {}
            (_, Some(_)) => {
                return Err(ChatError::Request(format!("messages[{i}]: only a tool message has tool_call_id")))
            }
            _ => {}
        }
    }
    Ok(())
}

/// ctx tool names and the names the model sees, both ways.
pub struct Names {
    to_model: HashMap<String, String>,
    to_ctx: HashMap<String, String>,
}

impl Names {
    pub fn new<'a>(names: impl Iterator<Item = &'a str>) -> Names {
        let mut to_model = HashMap::new();
        let mut to_ctx = HashMap::new();
        for name in names {
            let base: String = name
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
                .take(64)
                .collect();
            let mut candidate = base.clone();
            let mut n = 2;
            while to_ctx.contains_key(&candidate) {
                let suffix = format!("_{n}");
                candidate = format!("{}{suffix}", &base[..base.len().min(64 - suffix.len())]);
                n += 1;
            }
            to_model.insert(name.to_string(), candidate.clone());
            to_ctx.insert(candidate, name.to_string());
        }
        Names { to_model, to_ctx }
    }

    /// The model's name for a ctx tool (a tool no longer offered keeps a fitting form).
    pub fn for_model(&self, name: &str) -> String {
        self.to_model.get(name).cloned().unwrap_or_else(|| {
            name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).take(64).collect()
        })
    }

    /// The ctx tool a model's name stands for (unknown names pass through, and fail as unknown
    /// tools when called).
    pub fn for_ctx(&self, name: &str) -> String {
        self.to_ctx.get(name).cloned().unwrap_or_else(|| name.to_string())
    }
}

/// A tool call as the browser sees it.
fn call(id: String, name: String, arguments: Json) -> ChatToolCall {
    let arguments = match arguments {
        Json::Object(map) => map,
        Json::Null => Default::default(),
        other => {
            let mut map = serde_json::Map::new();
            map.insert("value".to_string(), other);
            map
        }
    };
    ChatToolCall { id, name, arguments }
}

/// The JSON Schema a model is handed for a tool: an object schema, never empty.
fn parameters_for_model(parameters: &Json) -> Json {
    match parameters {
        Json::Object(map) if map.get("type").and_then(Json::as_str) == Some("object") => parameters.clone(),
        _ => json!({"type": "object", "properties": {}}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_the_models_pattern_and_map_back() {
        let long = "x".repeat(80);
        let names = Names::new(["search", "github.create", "github_create", long.as_str()].into_iter());
        assert_eq!(names.for_model("search"), "search");
        assert_eq!(names.for_model("github.create"), "github_create");
        assert_eq!(names.for_model("github_create"), "github_create_2");
        assert_eq!(names.for_ctx("github_create_2"), "github_create");
        assert_eq!(names.for_ctx("github_create"), "github.create");
        assert_eq!(names.for_model(&long).len(), 64);
        assert_eq!(names.for_ctx(&"x".repeat(64)), long);
    }

    #[test]
    fn a_tool_message_must_answer_an_earlier_call() {
        let user = ChatMessage {
            role: ChatMessageRole::User,
            content: Some("hi".into()),
            tool_calls: vec![],
            tool_call_id: None,
        };
        let tool = ChatMessage {
            role: ChatMessageRole::Tool,
            content: Some("{}".into()),
            tool_calls: vec![],
            tool_call_id: Some("c1".into()),
        };
        let err = check(&[user.clone(), tool.clone()]).unwrap_err().to_string();
        assert!(err.contains("answers no tool call"), "{err}");
        let asked = ChatMessage {
            role: ChatMessageRole::Assistant,
            content: None,
            tool_calls: vec![call("c1".into(), "search".into(), json!({"query": "x"}))],
            tool_call_id: None,
        };
        check(&[user.clone(), asked, tool]).unwrap();
        let wrong = ChatMessage { tool_calls: vec![call("c2".into(), "x".into(), Json::Null)], ..user };
        assert!(check(&[wrong]).unwrap_err().to_string().contains("only an assistant"));
    }
}
