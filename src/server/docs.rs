//! The API's own documentation: `/openapi.json` (behind the token like every call) and the
//! Swagger UI under `/docs` (open to anyone: the page and its assets hold nothing private, and
//! its Authorize button sends the token to every call it makes).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::openapi::{self, schemas};
use super::respond::{ok, ApiError};
use super::App;
use crate::types::ErrorCode;

/// This document: OpenAPI 3.1, with one operation per loaded Lua tool and per agent.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "server",
    responses((status = 200, description = "The OpenAPI 3.1 document.", body = inline(schemas::JsonObject)),
        openapi::responses::GuardErrors))]
pub async fn openapi_json(State(app): State<Arc<App>>) -> Response {
    ok(&openapi::document(Some(&app.tools.current())))
}

fn swagger_config() -> Arc<utoipa_swagger_ui::Config<'static>> {
    static CONFIG: std::sync::OnceLock<Arc<utoipa_swagger_ui::Config<'static>>> = std::sync::OnceLock::new();
    Arc::clone(CONFIG.get_or_init(|| {
        // The validator badge would send the document to a third-party service.
        Arc::new(utoipa_swagger_ui::Config::from("/openapi.json").try_it_out_enabled(true).validator_url("none"))
    }))
}

/// The UI's assets are relative links, so the page must be served from `/docs/`.
pub async fn redirect() -> Response {
    axum::response::Redirect::permanent("/docs/").into_response()
}

pub async fn index() -> Response {
    swagger("")
}

pub async fn file(Path(file): Path<String>) -> Response {
    swagger(&file)
}

fn swagger(file: &str) -> Response {
    match utoipa_swagger_ui::serve(file, swagger_config()) {
        Ok(Some(found)) => {
            let mut response = Response::new(Body::from(found.bytes.into_owned()));
            if let Ok(value) = HeaderValue::from_str(&found.content_type) {
                response.headers_mut().insert(header::CONTENT_TYPE, value);
            }
            if found.gzpipped {
                response.headers_mut().insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            }
            response
        }
        Ok(None) => {
            ApiError::new(ErrorCode::NotFound, format!("no such file in the API docs: /docs/{file}")).into_response()
        }
        Err(e) => {
            tracing::error!("swagger ui: {e}");
            ApiError::new(ErrorCode::Internal, "the API docs failed to load; the server log has the details")
                .into_response()
        }
    }
}
