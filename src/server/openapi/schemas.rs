//! JSON Schemas (the schema files, each Lua tool's parameters) in utoipa's typed model, with
//! nothing lost on the way.
//!
//! utoipa's `Schema` holds the OpenAPI 3.0 subset of JSON Schema. Of the schema files'
//! definitions, most deserialize into it exactly; the rest fail (`const`, a schema without
//! `type`, `propertyNames` holding a `$ref`, a `$ref` with a `default` beside it), and a few
//! keywords would be dropped silently (`not`, `items` without `type`). So each schema is held
//! as the typed schema when that writes back to the same JSON; otherwise its `properties` are
//! converted one by one under a typed parent; and a node that still does not fit is kept
//! whole, as an untyped schema whose keywords sit in its extension map, which utoipa writes
//! out flat. The document is therefore the schema files, keyword for keyword (a test compares
//! them), and [`align`] gives each schema its file's key order back.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::{json, Map, Value as Json};
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::schema::{Object, Schema, SchemaType};
use utoipa::openapi::RefOr;

/// Where the components live in the document.
pub const PREFIX: &str = "#/components/schemas/";

/// The schema files' definitions, with references under [`PREFIX`], by name.
pub fn definitions() -> &'static BTreeMap<String, Json> {
    // Static: immutable, derived from the schema files compiled into the binary; every application may share it.
    static DEFS: OnceLock<BTreeMap<String, Json>> = OnceLock::new();
    DEFS.get_or_init(|| crate::schema::definitions(PREFIX))
}

/// The same definitions in the typed model (the document's `components.schemas`).
///
/// Built on each call, not kept: the typed model of every definition weighs more than a megabyte,
/// and a serving process needs it only for the rare `/openapi.json` (whose document is cached).
pub fn components() -> BTreeMap<String, RefOr<Schema>> {
    definitions().iter().map(|(name, def)| (name.clone(), typed(def))).collect()
}

/// `schema` in the typed model; written out, it is the same JSON (see the module comment).
pub fn typed(schema: &Json) -> RefOr<Schema> {
    if let Some(exact) = exact(schema) {
        return exact;
    }
    if let Json::Object(map) = schema {
        if let Some(Json::Object(properties)) = map.get("properties") {
            let mut parent = map.clone();
            parent.remove("properties");
            if let Some(RefOr::T(Schema::Object(mut object))) = exact(&Json::Object(parent)) {
                for (name, property) in properties {
                    object.properties.insert(name.clone(), typed(property));
                }
                return RefOr::T(Schema::Object(object));
            }
        }
    }
    verbatim(schema)
}

/// The typed schema, when utoipa reads `schema` and writes back exactly the same JSON.
fn exact(schema: &Json) -> Option<RefOr<Schema>> {
    let typed: RefOr<Schema> = serde_json::from_value(schema.clone()).ok()?;
    (serde_json::to_value(&typed).ok()? == *schema).then_some(typed)
}

/// `schema` kept whole: an untyped schema (utoipa omits its `type`) whose keywords are all in
/// the extension map, which utoipa writes out flat beside the (empty) typed fields.
fn verbatim(schema: &Json) -> RefOr<Schema> {
    let Json::Object(map) = schema else {
        // `true` / `false` schemas: none in the files, and tool schemas are objects.
        return RefOr::T(Schema::Object(Object::with_type(SchemaType::AnyValue)));
    };
    let mut object = Object::with_type(SchemaType::AnyValue);
    let mut keywords = Extensions::default();
    keywords.extend(map.iter().map(|(k, v)| (k.clone(), v.clone())));
    object.extensions = Some(keywords);
    RefOr::T(Schema::Object(object))
}

/// Puts the keys of `written` (a schema as utoipa wrote it) in the order of `original` (the
/// same schema as its file has it), at every depth: utoipa writes its fields in its own order
/// and extension keys in hash order, which would reshuffle the checked-in document at every
/// export.
pub fn align(written: &mut Json, original: &Json) {
    match (written, original) {
        (Json::Object(map), Json::Object(order)) => {
            let mut sorted = Map::new();
            for (key, value) in order {
                if let Some(mut child) = map.remove(key) {
                    align(&mut child, value);
                    sorted.insert(key.clone(), child);
                }
            }
            sorted.append(map);
            *map = sorted;
        }
        (Json::Array(items), Json::Array(order)) => {
            for (item, original) in items.iter_mut().zip(order) {
                align(item, original);
            }
        }
        _ => {}
    }
}

/// Declares a type standing for the schema-file definition of the same name, for
/// `#[utoipa::path]` bodies: the operation references `#/components/schemas/<Name>`, and the
/// component is the schema file's definition.
macro_rules! component {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("The `", stringify!($name), "` definition of the schema files.")]
        pub struct $name;

        impl utoipa::PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                component(stringify!($name))
            }
        }

        impl utoipa::ToSchema for $name {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }
        }
    )*};
}

component!(
    AgentPrompt,
    AgentsList,
    Approval,
    ApprovalsList,
    CallsResponse,
    ChatInfo,
    ChatRequest,
    ChatResponse,
    Document,
    Error,
    GetRequest,
    Health,
    SearchRequest,
    SearchResponse,
    SourcesResponse,
    SyncJob,
    SyncJobs,
    Task,
    TasksList,
    ToolResult,
    ToolsList,
);

/// A reference to the definition `name`. The definition itself joins the document as a component
/// when the document is built (`openapi::fixed`): building the router then converts no schema,
/// which kept more than a megabyte of utoipa's model in a serving process's heap. The tests check
/// that every reference resolves.
fn component(name: &str) -> RefOr<Schema> {
    RefOr::Ref(utoipa::openapi::Ref::from_schema_name(name))
}

/// The `name` path parameter of the generic tool call: a tool name, but not `list` (whose route
/// takes GET only). A built-in's name is allowed: `POST /tools/sources` is both the built-in's own
/// operation and this one, and [`ToolAnswer`] says what it answers.
pub struct ToolName;

// Only ever inlined: the name is never referenced.
impl utoipa::ToSchema for ToolName {}

impl utoipa::PartialSchema for ToolName {
    fn schema() -> RefOr<Schema> {
        let schema = json!({
            "type": "string",
            "pattern": "^(?!list$)[A-Za-z0-9_.-]{1,128}$",
            "description": "A tool's name, as listed by GET /tools/list.",
        });
        serde_json::from_value(schema).unwrap_or_default()
    }
}

/// What `POST /tools/{name}` answers with 200: `{"result": ...}` (`ToolResult`) for a Lua tool,
/// an upstream server's tool or a code-mode tool; the body of its own operation for a built-in
/// (search, get, sources), whose routes these are. The shapes are disjoint (each requires its
/// own fields and allows no others), so exactly one matches: `oneOf`.
pub struct ToolAnswer;

// Only ever inlined: the name is never referenced.
impl utoipa::ToSchema for ToolAnswer {}

impl utoipa::PartialSchema for ToolAnswer {
    fn schema() -> RefOr<Schema> {
        let mut answer = utoipa::openapi::schema::OneOfBuilder::new().description(Some(
            "{\"result\": ...} for a Lua, upstream or code-mode tool; a built-in's own body for search, get and sources.",
        ));
        for name in ["ToolResult", "SearchResponse", "Document", "SourcesResponse"] {
            answer = answer.item(component(name));
        }
        RefOr::T(Schema::OneOf(answer.build()))
    }
}

/// The `name` path parameter of the generic agent prompt.
pub struct AgentName;

// Only ever inlined: the name is never referenced.
impl utoipa::ToSchema for AgentName {}

impl utoipa::PartialSchema for AgentName {
    fn schema() -> RefOr<Schema> {
        serde_json::from_value(json!({ "type": "string", "pattern": "^[A-Za-z0-9_.-]{1,128}$" })).unwrap_or_default()
    }
}

/// Any JSON object (the OpenAPI document itself).
pub struct JsonObject;

// Only ever inlined: the name is never referenced.
impl utoipa::ToSchema for JsonObject {}

impl utoipa::PartialSchema for JsonObject {
    fn schema() -> RefOr<Schema> {
        utoipa::openapi::schema::Object::with_type(utoipa::openapi::schema::Type::Object).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_file_definition_is_written_back_unchanged() {
        let components = components();
        for (name, def) in definitions() {
            let mut written = serde_json::to_value(&components[name]).unwrap();
            assert_eq!(&written, def, "{name}");
            align(&mut written, def);
            assert_eq!(written.to_string(), def.to_string(), "{name}: key order");
        }
    }

    #[test]
    fn what_utoipa_cannot_hold_is_kept_whole() {
        let schema = json!({
            "type": "object",
            "required": ["kind"],
            "properties": {
                "kind": { "const": "text", "description": "Always text." },
                "any": { "description": "Any JSON." },
                "list": { "type": "array", "items": { "description": "One of anything." } },
                "limits": { "$ref": "#/components/schemas/Name", "default": {} },
                "plain": { "type": "string", "maxLength": 3 },
            },
            "not": { "required": ["any"] },
        });
        let written = serde_json::to_value(typed(&schema)).unwrap();
        assert_eq!(written, schema);
        // The parent is typed apart from `not`, so the whole node is kept; its properties are not
        // typed one by one either, but nothing is lost.
        let RefOr::T(Schema::Object(plain)) = typed(&json!({ "type": "string", "maxLength": 3 })) else {
            panic!("a plain string schema is typed")
        };
        assert_eq!(plain.max_length, Some(3));
        let RefOr::T(Schema::Object(parent)) =
            typed(&json!({ "type": "object", "properties": { "kind": { "const": "a" }, "n": { "type": "integer" } } }))
        else {
            panic!("an object schema is typed")
        };
        let untyped = |o: &Object| o.extensions.as_ref().is_some_and(|e| !e.is_empty());
        assert!(!untyped(&parent), "the parent is typed");
        assert!(matches!(&parent.properties["n"], RefOr::T(Schema::Object(n)) if !untyped(n)));
        assert!(
            matches!(&parent.properties["kind"], RefOr::T(Schema::Object(k)) if untyped(k)),
            "`kind` is kept whole"
        );
    }
}
