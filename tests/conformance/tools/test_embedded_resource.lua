-- Conformance fixture (scenario tools-call-embedded-resource): one embedded text resource.

tool = {
    name = "test_embedded_resource",
    description = "Returns an embedded resource content block (MCP conformance fixture).",
    annotations = { read_only = true, idempotent = true, open_world = false },
}

function tool.execute()
    return MCP.content({
        {
            type = "resource",
            resource = {
                uri = "test://embedded-resource",
                mimeType = "text/plain",
                text = "This is an embedded resource content.",
            },
        },
    })
end
