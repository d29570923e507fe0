-- Conformance fixture (scenario tools-call-mixed-content): text, image and embedded resource
-- blocks in one result.

-- The reference server's 1x1 PNG, base64.
local PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="

tool = {
    name = "test_multiple_content_types",
    description = "Returns text, image and resource content blocks together (MCP conformance fixture).",
    annotations = { read_only = true, idempotent = true, open_world = false },
}

function tool.execute()
    return MCP.content({
        { type = "text", text = "Multiple content types test:" },
        { type = "image", data = PNG, mimeType = "image/png" },
        {
            type = "resource",
            resource = {
                uri = "test://mixed-content-resource",
                mimeType = "application/json",
                text = '{"test":"data","value":123}',
            },
        },
    })
end
