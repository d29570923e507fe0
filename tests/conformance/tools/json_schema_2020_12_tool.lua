-- Conformance fixture (scenario json-schema-2020-12): parameters in the JSON Schema form. Only
-- tools/list is checked: inputSchema must come through verbatim, keeping $schema, $defs (with
-- address.$anchor), additionalProperties = false, allOf/anyOf and if/then/else.

tool = {
    name = "json_schema_2020_12_tool",
    description = "Tool with JSON Schema 2020-12 features",
    parameters = {
        ["$schema"] = "https://json-schema.org/draft/2020-12/schema",
        type = "object",
        ["$defs"] = {
            address = {
                ["$anchor"] = "addressDef",
                type = "object",
                properties = {
                    street = { type = "string" },
                    city = { type = "string" },
                },
            },
        },
        properties = {
            name = { type = "string" },
            address = { ["$ref"] = "#/$defs/address" },
            contactMethod = { type = "string", enum = { "phone", "email" } },
            phone = { type = "string" },
            email = { type = "string" },
        },
        allOf = {
            { anyOf = { { required = { "phone" } }, { required = { "email" } } } },
        },
        ["if"] = {
            properties = { contactMethod = { const = "phone" } },
            required = { "contactMethod" },
        },
        ["then"] = { required = { "phone" } },
        ["else"] = { required = { "email" } },
        additionalProperties = false,
    },
    annotations = { read_only = true, idempotent = true, open_world = false },
}

function tool.execute(params)
    return { received = params }
end
