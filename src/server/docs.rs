//! The API's own documentation: `/openapi.json` and the Swagger UI under `/docs`. Both open
//! without the token: the pages are static assets, and without the token the document holds
//! only what the repository publishes (`openapi/openapi.json`), not this server's Lua tools and
//! agents. It declares the bearer scheme, so the UI shows its Authorize button, and every call
//! made from the UI carries the token.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::guard::Authorized;
use super::openapi::{self, schemas};
use super::respond::{ok, ApiError};
use super::App;
use crate::types::ErrorCode;

/// This document: OpenAPI 3.1.
///
/// With the token (or when the server has none), one operation per loaded Lua tool and per
/// agent is added to the fixed ones; without it, the document is the published one.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "server",
    responses((status = 200, description = "The OpenAPI 3.1 document.", body = inline(schemas::JsonObject)),
        openapi::responses::GuardErrors))]
pub async fn openapi_json(
    State(app): State<Arc<App>>,
    authorized: Option<Extension<Authorized>>,
    caller: Option<Extension<super::guard::Caller>>,
) -> Response {
    let full = authorized.is_some_and(|Extension(Authorized(yes))| yes);
    let registry = full.then(|| app.tools.current());
    let principal = caller.and_then(|Extension(super::guard::Caller(p))| p);
    ok(&openapi::document_for(registry.as_deref(), principal.as_deref()))
}

fn swagger_config() -> Arc<utoipa_swagger_ui::Config<'static>> {
    // Static: immutable, built from constants only: every application serves the same Swagger UI config.
    static CONFIG: std::sync::OnceLock<Arc<utoipa_swagger_ui::Config<'static>>> = std::sync::OnceLock::new();
    Arc::clone(CONFIG.get_or_init(|| {
        // The validator badge would send the document to a third-party service. The token a user
        // enters under Authorize is kept across reloads of the page.
        let config = utoipa_swagger_ui::Config::from("/openapi.json")
            .try_it_out_enabled(true)
            .persist_authorization(true)
            .validator_url("none");
        Arc::new(config)
    }))
}

/// The page at `/docs`, where its relative links (`./swagger-ui.css`) would resolve to `/`:
/// a `<base href="/docs/">` points them back under `/docs/`. (A redirect there answered an
/// empty 308 to any client that does not follow it.)
pub async fn bare_index() -> Response {
    swagger("", Some("/docs/"))
}

pub async fn index() -> Response {
    swagger("", None)
}

pub async fn file(Path(file): Path<String>) -> Response {
    swagger(&file, None)
}

/// One file of the UI; an HTML page gets `<base href>` when `base` is given.
fn swagger(file: &str, base: Option<&str>) -> Response {
    match utoipa_swagger_ui::serve(file, swagger_config()) {
        Ok(Some(found)) => {
            let mut bytes = found.bytes.into_owned();
            if let Some(base) = base.filter(|_| !found.gzpipped) {
                let page = String::from_utf8_lossy(&bytes).replacen(
                    "<head>",
                    &format!("<head>\n    <base href=\"{base}\">"),
                    1,
                );
                bytes = page.into_bytes();
            }
            let mut response = Response::new(Body::from(bytes));
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
