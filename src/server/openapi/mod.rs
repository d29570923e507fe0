//! The OpenAPI document, in utoipa's typed model.
//!
//! The fixed operations come from the `#[utoipa::path]` of each route (see `server::routes`);
//! `components.schemas` are the schema files' definitions (see [`schemas`]). The served document
//! adds one operation per loaded Lua tool (`POST /tools/<name>`, its parameter schema as the
//! body) and one per agent (`POST /agents/<name>/prompt`, its arguments as the body). The
//! document checked in at `openapi/openapi.json` is the one without a registry.

pub mod responses;
pub mod schemas;

use std::sync::OnceLock;

use serde_json::{json, Map, Value as Json};
use utoipa::openapi::path::{HttpMethod, Operation, OperationBuilder, PathItem};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, InfoBuilder, OpenApi, OpenApiBuilder, Ref, Required, ResponseBuilder};
use utoipa::IntoResponses;

use crate::agents::AgentSpec;
use crate::tools::{Registry, ToolSpec};

/// The name of the bearer security scheme.
const BEARER: &str = "bearer";

/// What the routes add their operations to: info and security. The schema files join as
/// components in [`fixed`], once the routes are in.
pub fn base() -> OpenApi {
    let mut doc = OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("ctx")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "Context and actions for AI agents. Every schema below comes from schemas/ in the ctx repository.",
                ))
                .build(),
        )
        // With server.auth_token set every operation but /health and /openapi.json needs the
        // token; without one, none does. The document cannot know which, so both are listed.
        .security(Some([SecurityRequirement::new(BEARER, Vec::<String>::new()), SecurityRequirement::default()]))
        .build();
    // No `jsonSchemaDialect`: OpenAPI 3.1's default dialect is JSON Schema 2020-12 with OpenAPI's
    // vocabulary, which is what the schema files use, and Swagger UI shows a red warning for any
    // other value.
    let components = doc.components.get_or_insert_with(Default::default);
    let bearer = HttpBuilder::new()
        .scheme(HttpAuthScheme::Bearer)
        .description(Some("server.auth_token, when it is set. Swagger UI's Authorize button sends it."))
        .build();
    components.add_security_scheme(BEARER, SecurityScheme::Http(bearer));
    doc
}

/// The fixed part of the document (every route's operation), built once, on the first request
/// for it. The routes name their bodies by reference only (see `schemas::component!`), so the
/// server builds its router without converting a single schema; the schema files' definitions
/// join here as the components those references resolve to.
fn fixed() -> &'static OpenApi {
    // Static: immutable, the routes and schemas compiled into the binary, no registry's tools; shared by all.
    static DOC: OnceLock<OpenApi> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = super::routes().into_openapi();
        doc.components.get_or_insert_with(Default::default).schemas.extend(schemas::components());
        doc
    })
}

/// The document as JSON: checked in at `openapi/openapi.json` without a registry, served with one.
pub fn document(registry: Option<&Registry>) -> Json {
    document_for(registry, None)
}

/// [`document`] as a scoped token sees it: the operations of the tools outside its scope are
/// left out, built-in ones included, as if those tools did not exist.
pub fn document_for(registry: Option<&Registry>, principal: Option<&crate::tools::Principal>) -> Json {
    let mut doc = fixed().clone();
    if let Some(principal) = principal {
        for builtin in crate::tools::BUILTINS {
            if !principal.allows(builtin) {
                doc.paths.paths.remove(&format!("/tools/{builtin}"));
            }
        }
    }
    let mut bodies = Vec::new();
    if let Some(registry) = registry {
        for spec in registry.specs().filter(|s| !s.builtin && crate::tools::principal::allows(principal, &s.name)) {
            let path = format!("/tools/{}", spec.name);
            doc.paths.add_path_operation(&path, vec![HttpMethod::Post], tool_operation(spec));
            bodies.push((path, spec.params.schema().clone()));
        }
        for spec in registry.agents_for(principal) {
            let path = format!("/agents/{}/prompt", spec.name);
            let schema = agent_arguments(spec);
            doc.paths.add_path_operation(&path, vec![HttpMethod::Post], agent_operation(spec, &schema));
            bodies.push((path, schema));
        }
    }
    let mut json = serde_json::to_value(&doc).unwrap_or_else(|e| {
        tracing::error!("the OpenAPI document does not serialize: {e}");
        json!({})
    });
    for (name, def) in schemas::definitions() {
        if let Some(written) = json["components"]["schemas"].get_mut(name) {
            schemas::align(written, def);
        }
    }
    for (path, schema) in &bodies {
        if let Some(written) =
            json["paths"][path]["post"]["requestBody"]["content"]["application/json"].get_mut("schema")
        {
            schemas::align(written, schema);
        }
    }
    json
}

/// `POST /tools/<name>` of one Lua tool: its parameter schema is the body, required when the
/// tool has a required parameter (without one, no body means no parameters).
fn tool_operation(spec: &ToolSpec) -> Operation {
    let schema = spec.params.schema();
    let needs_body = schema.get("required").and_then(Json::as_array).is_some_and(|r| !r.is_empty());
    let body = schemas::typed(schema);
    let ok = ResponseBuilder::new()
        .description("What the tool returned.")
        .content("application/json", Content::new(Some(Ref::from_schema_name("ToolResult"))))
        .build();
    OperationBuilder::new()
        .operation_id(Some(format!("tool_{}", identifier(&spec.name))))
        .summary(Some(spec.description.clone()))
        .tag("lua tools")
        .request_body(Some(
            RequestBodyBuilder::new()
                .content("application/json", Content::new(Some(body)))
                .required(Some(is_required(needs_body)))
                .build(),
        ))
        .responses(responses::with_ok(ok, responses::CallErrors::responses()))
        .build()
}

/// The JSON Schema of an agent's arguments: strings, the required ones listed.
fn agent_arguments(spec: &AgentSpec) -> Json {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for arg in &spec.arguments {
        let mut property = json!({ "type": "string" });
        if let Some(description) = &arg.description {
            property["description"] = json!(description);
        }
        properties.insert(arg.name.to_string(), property);
        if arg.required {
            required.push(arg.name.to_string());
        }
    }
    let mut schema = json!({ "type": "object", "properties": properties, "additionalProperties": false });
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    schema
}

/// `POST /agents/<name>/prompt` of one agent: its arguments are the body, required when one of
/// them is (without one, no body means no arguments).
fn agent_operation(spec: &AgentSpec, arguments: &Json) -> Operation {
    let needs_body = arguments.get("required").is_some();
    let ok = ResponseBuilder::new()
        .description("The resolved prompt.")
        .content("application/json", Content::new(Some(Ref::from_schema_name("AgentPrompt"))))
        .build();
    OperationBuilder::new()
        .operation_id(Some(format!("agent_{}", identifier(&spec.name))))
        .summary(Some(spec.description.clone()))
        .tag("agents")
        .request_body(Some(
            RequestBodyBuilder::new()
                .description(Some("The agent's arguments by name."))
                .content("application/json", Content::new(Some(schemas::typed(arguments))))
                .required(Some(is_required(needs_body)))
                .build(),
        ))
        .responses(responses::with_ok(ok, responses::CallErrors::responses()))
        .build()
}

/// A name as an operationId fragment (letters, digits and `_`).
fn identifier(name: &str) -> String {
    name.replace(['-', '.'], "_")
}

/// The methods the document declares for `path` (a request path, matched against the
/// templates), for 405 answers and their `Allow` header. `None` when no path matches.
pub fn methods_for(path: &str) -> Option<Vec<&'static str>> {
    let doc = fixed();
    let mut found: Option<&PathItem> = doc.paths.paths.get(path);
    if found.is_none() {
        found = doc.paths.paths.iter().find(|(template, _)| matches(template, path)).map(|(_, item)| item);
    }
    let item = found?;
    let mut methods = Vec::new();
    if item.get.is_some() {
        methods.extend(["GET", "HEAD"]);
    }
    if item.post.is_some() {
        methods.push("POST");
    }
    if item.put.is_some() {
        methods.push("PUT");
    }
    if item.delete.is_some() {
        methods.push("DELETE");
    }
    Some(methods)
}

/// Whether `path` fits `template`, a `{param}` standing for one segment.
fn matches(template: &str, path: &str) -> bool {
    let (mut t, mut p) = (template.split('/'), path.split('/'));
    loop {
        match (t.next(), p.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if (a.starts_with('{') && a.ends_with('}') && !b.is_empty()) || a == b => {}
            _ => return false,
        }
    }
}

/// utoipa's `Required` has no `From<bool>`.
fn is_required(yes: bool) -> Required {
    if yes {
        Required::True
    } else {
        Required::False
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_match_one_segment_per_parameter() {
        assert!(matches("/agents/{name}/prompt", "/agents/x/prompt"));
        assert!(!matches("/agents/{name}/prompt", "/agents//prompt"));
        assert!(!matches("/agents/{name}/prompt", "/agents/x/prompt/more"));
        assert!(matches("/tools/list", "/tools/list"));
        assert_eq!(methods_for("/agents/x/prompt"), Some(vec!["POST"]));
        assert_eq!(methods_for("/tools/sources"), Some(vec!["GET", "HEAD", "POST"]));
        assert_eq!(methods_for("/nowhere"), None);
    }
}
