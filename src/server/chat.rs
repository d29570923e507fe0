//! `GET /chat` and `POST /chat`: one turn of a conversation with the `[chat]` model, offered the
//! tools the caller's token may use. The caller runs the calls the model asks for through
//! `POST /tools/{name}` (the one call path), so a chat cannot do what its token could not.

use std::sync::{Arc, OnceLock};

use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value as Json};

use super::guard;
use super::openapi::responses::GuardErrors;
use super::respond::{object_body, ok, ApiError};
use super::App;
use crate::chat::{Chat, ChatError, Offer};
use crate::schema::{Dialect, SchemaValidator};
use crate::types::{ChatConfig, ChatInfo, ChatRequest, ChatResponse, ErrorCode};

/// What `[chat]` looks like, for the messages that say how to turn it on.
const HOW: &str = "add a [chat] section to ctx.toml: provider = \"openai\" (any OpenAI-compatible API) or \"ollama\", \
     model = \"...\", url = \"...\" (optional), api_key = \"${OPENAI_API_KEY}\" (optional); the server reloads it";

/// Whether chat is on, with which model, and how many tools the model would be offered.
#[utoipa::path(get, path = "/chat", operation_id = "chatInfo", tag = "chat",
    responses((status = 200, description = "Whether [chat] is configured.", body = super::openapi::schemas::ChatInfo),
        GuardErrors))]
pub async fn info(State(app): State<Arc<App>>, caller: Option<Extension<guard::Caller>>) -> Response {
    let body = match settings(&app).map(|spec| Chat::from_config(&spec)) {
        None => ChatInfo {
            enabled: false,
            provider: None,
            model: None,
            tools: None,
            hint: Some(format!("chat is off: {HOW}")),
        },
        Some(Err(e)) => {
            ChatInfo { enabled: false, provider: None, model: None, tools: None, hint: Some(e.to_string()) }
        }
        Some(Ok(chat)) => ChatInfo {
            enabled: true,
            provider: Some(chat.provider().to_string()),
            model: Some(chat.model().to_string()),
            tools: Some(chat.offered(&offers(&app, &caller)).len() as u64),
            hint: None,
        },
    };
    ok(&serde_json::to_value(body).unwrap_or_default())
}

/// The model's next message after the conversation sent.
///
/// The model is offered the tools this token may use (at most `chat.max_tools`), under names
/// that fit its API and are mapped back: each tool call in the answer names a ctx tool, to run
/// with `POST /tools/{name}`; send its result back as a `tool` message.
#[utoipa::path(post, path = "/chat", operation_id = "chat", tag = "chat",
    request_body = super::openapi::schemas::ChatRequest,
    responses((status = 200, description = "The model's message.", body = super::openapi::schemas::ChatResponse),
        (status = 400, description = "The conversation is not valid (every problem in details).", body = super::openapi::schemas::Error),
        (status = 502, description = "The model failed or did not answer (bad_gateway); the message quotes it.", body = super::openapi::schemas::Error),
        (status = 503, description = "[chat] is not configured (unavailable); the message says how to turn it on.", body = super::openapi::schemas::Error),
        GuardErrors))]
pub async fn turn(
    State(app): State<Arc<App>>,
    caller: Option<Extension<guard::Caller>>,
    headers: HeaderMap,
    request: axum::extract::Request,
) -> Response {
    let what = "the conversation, {\"messages\": [...]}";
    let body = match object_body(&headers, request.into_body(), app.max_body_bytes, what).await {
        Ok(body) => Json::Object(body),
        Err(e) => return e.into_response(),
    };
    // Static: immutable, compiled from the schema files in the binary; every application shares it.
    static VALIDATOR: OnceLock<SchemaValidator> = OnceLock::new();
    let problems =
        VALIDATOR.get_or_init(|| SchemaValidator::for_definition("ChatRequest")).problems(&body, Dialect::Json);
    if !problems.is_empty() {
        let details: Vec<Json> = problems.iter().map(|p| json!({"path": p.pointer(), "message": p.message})).collect();
        let message = format!(
            "the conversation is not valid: {}",
            problems.iter().map(|p| format!("{}: {}", p.pointer(), p.message)).collect::<Vec<_>>().join("; ")
        );
        let envelope = json!({"error": {"code": ErrorCode::BadRequest, "message": message, "details": details}});
        let mut response = ok(&envelope);
        *response.status_mut() = axum::http::StatusCode::BAD_REQUEST;
        return response;
    }
    let request: ChatRequest = match serde_json::from_value(body) {
        Ok(request) => request,
        Err(e) => {
            return ApiError::new(ErrorCode::BadRequest, format!("the conversation is not valid: {e}")).into_response()
        }
    };
    // Input first: a malformed conversation is the caller's to fix whatever the config.
    let Some(spec) = settings(&app) else {
        return ApiError::new(ErrorCode::Unavailable, format!("chat is off: {HOW}")).into_response();
    };
    let chat = match Chat::from_config(&spec) {
        Ok(chat) => chat,
        Err(e) => return ApiError::new(ErrorCode::Unavailable, e.to_string()).into_response(),
    };
    let tools = offers(&app, &caller);
    match chat.answer(&request.messages, &tools).await {
        Ok(message) => {
            ok(&serde_json::to_value(ChatResponse { message, model: chat.model().to_string() }).unwrap_or_default())
        }
        Err(ChatError::Request(why)) => ApiError::new(ErrorCode::BadRequest, why).into_response(),
        Err(ChatError::Config(why)) => ApiError::new(ErrorCode::Unavailable, why).into_response(),
        Err(ChatError::Model(why)) => {
            tracing::warn!("chat: {why}");
            ApiError::new(ErrorCode::BadGateway, why).into_response()
        }
    }
}

/// `[chat]` of the config the server runs now (it follows hot reloads).
fn settings(app: &App) -> Option<ChatConfig> {
    app.tools.current().kb().config().spec.chat.clone()
}

/// The tools this caller may use, as the model is offered them.
fn offers(app: &App, caller: &Option<Extension<guard::Caller>>) -> Vec<Offer> {
    let principal = caller.as_ref().and_then(|Extension(guard::Caller(p))| p.clone());
    let listing = app.tools.current().listing_for(principal.as_deref());
    listing
        .tools
        .into_iter()
        .map(|t| Offer { name: t.name, description: t.description, parameters: Json::Object(t.parameters) })
        .collect()
}
