//! The REST routes hold to what the OpenAPI document declares, route by route as the document
//! lists them (so a new route is covered without editing this file): a JSON body the document
//! declares an object is refused when it is `null` or another non-object, and an empty body still
//! means no parameters; a boolean query parameter takes `true` or `false` and nothing else; and
//! the generic `POST /tools/{name}` answers one of the shapes its 200 response lists, for a Lua
//! tool and for each built-in reached through it.

use ctx::schema::{Dialect, SchemaValidator};
use ctx::server;
use serde_json::{json, Value};

use crate::http::{assert_envelope, start, Running};

/// Every `(method, path template)` of the published document with the operation.
fn operations() -> Vec<(String, String, Value)> {
    let document = server::openapi::document(None);
    let mut all = Vec::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            all.push((method.clone(), path.clone(), operation.clone()));
        }
    }
    all
}

/// A request path for a template: a Lua tool of the test server, an agent, an approval id.
fn concrete(template: &str) -> String {
    template.replace("/tools/{name}", "/tools/echo").replace("{name}", "nobody").replace("{id}", "ap-nope")
}

fn raw_post(s: &Running, path: &str, body: &'static str) -> (u16, Value) {
    let request = s.client.post(format!("{}{path}", s.base)).header("content-type", "application/json").body(body);
    let (status, body, _) = s.send(request);
    (status, body)
}

#[test]
fn a_json_body_that_is_not_an_object_is_refused_on_every_route_that_takes_one() {
    let s = start(None, &[]);
    let document = server::openapi::document(None);
    let mut checked = Vec::new();
    for (method, template, operation) in operations() {
        let Some(schema) = operation["requestBody"]["content"]["application/json"].get("schema") else { continue };
        assert_eq!(method, "post", "{template}: a body on {method}");
        // The document declares the body an object, directly or through its component.
        let declared = match schema["$ref"].as_str() {
            Some(reference) => &document["components"]["schemas"][reference.rsplit('/').next().unwrap()],
            None => schema,
        };
        assert_eq!(declared["type"], "object", "{template}: {declared}");
        let path = concrete(&template);
        for (sent, got) in [("null", "null"), ("[]", "an array"), ("\"x\"", "a string"), ("7", "a number")] {
            let (status, body) = raw_post(&s, &path, sent);
            assert_envelope(status, &body, 400, "bad_request");
            let message = body["error"]["message"].as_str().unwrap();
            assert!(message.starts_with("the request body must be a JSON object of "), "{path} {sent}: {message}");
            assert!(message.contains(&format!("; got {got}")), "{path} {sent}: {message}");
        }
        checked.push(template);
    }
    // The routes of the document with a body, each of them checked above.
    let expected = [
        "/agents/{name}/prompt",
        "/approvals/{id}/deny",
        "/chat",
        "/sources/{name}/sync",
        "/tools/get",
        "/tools/search",
        "/tools/{name}",
    ];
    assert_eq!(checked, expected);
    // POST /tools/sources declares no body and takes none: null is refused there too, as on
    // every route that reads one.
    let (status, body) = raw_post(&s, "/tools/sources", "null");
    assert_envelope(status, &body, 400, "bad_request");
}

#[test]
fn an_empty_body_still_means_no_parameters() {
    let s = start(None, &[]);
    let (status, body) = raw_post(&s, "/tools/sources", "");
    assert_eq!(status, 200, "{body}");
    assert!(body["sources"].is_array(), "{body}");
    // echo needs `message`: an empty body is the empty object, so that is what is missing.
    let (status, body) = raw_post(&s, "/tools/echo", "  ");
    assert_envelope(status, &body, 400, "bad_request");
    assert_eq!(body["error"]["details"][0]["path"], "/message", "{body}");
    // The same for a denial, whose body is optional: the request gets past the body to the
    // approver check.
    let (status, body) = raw_post(&s, "/approvals/ap-nope/deny", "");
    assert_envelope(status, &body, 403, "forbidden");
}

#[test]
fn a_denial_takes_only_a_string_reason() {
    let s = start(None, &[]);
    for (sent, says) in [
        (r#"{"reason": 5}"#, "reason must be a string"),
        (r#"{"reason": null}"#, "reason must be a string"),
        (r#"{"why": "no"}"#, "unknown field \"why\""),
    ] {
        let (status, body) = raw_post(&s, "/approvals/ap-nope/deny", sent);
        assert_envelope(status, &body, 400, "bad_request");
        assert!(body["error"]["message"].as_str().unwrap().contains(says), "{sent}: {body}");
    }
}

#[test]
fn boolean_query_parameters_take_true_or_false_only() {
    let s = start(None, &[]);
    let mut checked = Vec::new();
    for (method, template, operation) in operations() {
        for parameter in operation["parameters"].as_array().into_iter().flatten() {
            if parameter["in"] != "query" || parameter["schema"]["type"] != "boolean" {
                continue;
            }
            assert_eq!(method, "get", "{template}");
            let name = parameter["name"].as_str().unwrap();
            for good in ["true", "false"] {
                let (status, body) = s.get(&format!("{template}?{name}={good}"));
                assert_eq!(status, 200, "{template}?{name}={good}: {body}");
            }
            for bad in ["", "yes", "1", "TRUE", "maybe"] {
                let (status, body) = s.get(&format!("{template}?{name}={bad}"));
                assert_envelope(status, &body, 400, "bad_request");
                let message = body["error"]["message"].as_str().unwrap();
                assert!(message.contains(&format!("query parameter {name}={bad:?} is not a boolean")), "{message}");
                assert!(message.contains(&format!("give {name}=true or {name}=false")), "{message}");
            }
            checked.push(format!("{template}?{name}"));
        }
    }
    assert_eq!(checked, ["/approvals?all", "/calls?errors"]);
    // Each route names the parameters it takes.
    let (status, body) = s.get("/approvals?everything=true");
    assert_envelope(status, &body, 400, "bad_request");
    assert!(body["error"]["message"].as_str().unwrap().contains("GET /approvals takes all"), "{body}");
}

/// The names of the 200 shapes `POST /tools/{name}` declares that `body` matches.
fn matching_shapes(body: &Value) -> Vec<String> {
    let document = server::openapi::document(None);
    let answer =
        &document["paths"]["/tools/{name}"]["post"]["responses"]["200"]["content"]["application/json"]["schema"];
    let shapes: Vec<&str> = answer["oneOf"]
        .as_array()
        .unwrap_or_else(|| panic!("the 200 answer is a oneOf: {answer}"))
        .iter()
        .map(|s| s["$ref"].as_str().unwrap().rsplit('/').next().unwrap())
        .collect();
    shapes
        .into_iter()
        .filter(|name| SchemaValidator::for_definition(name).problems(body, Dialect::Json).is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_generic_tool_route_answers_a_shape_its_document_lists() {
    let s = start(None, &[]);
    let calls = [
        ("/tools/echo", json!({"message": "hi"}), "ToolResult"),
        ("/tools/search", json!({"query": "deploy"}), "SearchResponse"),
        ("/tools/sources", json!({}), "SourcesResponse"),
        // A built-in's name percent-encoded reaches the generic handler itself, not the
        // built-in's own route: the same body comes back.
        ("/tools/%73ources", json!({}), "SourcesResponse"),
    ];
    for (path, params, shape) in calls {
        let (status, body) = s.post(path, params);
        assert_eq!(status, 200, "{path}: {body}");
        assert_eq!(matching_shapes(&body), [shape], "{path}: {body}");
    }
    let (_, found) = s.post("/tools/search", json!({"query": "roll back a deploy", "limit": 1}));
    let id = found["results"][0]["id"].clone();
    let (status, body) = s.post("/tools/get", json!({ "id": id }));
    assert_eq!((status, matching_shapes(&body)), (200, vec!["Document".to_string()]), "{body}");
    // `list` is the one name the path parameter excludes: its route takes GET only.
    let (status, body) = s.post("/tools/list", json!({}));
    assert_envelope(status, &body, 405, "method_not_allowed");
}
