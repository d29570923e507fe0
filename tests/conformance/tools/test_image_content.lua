-- Conformance fixture (scenario tools-call-image): one image block, a 1x1 PNG.

-- The reference server's 1x1 PNG, base64.
local PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="

tool = {
    name = "test_image_content",
    description = "Returns an image content block (MCP conformance fixture).",
    annotations = { read_only = true, idempotent = true, open_world = false },
}

function tool.execute()
    return MCP.content({
        { type = "image", data = PNG, mimeType = "image/png" },
    })
end
