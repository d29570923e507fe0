-- Conformance fixture (scenario tools-call-simple-text): one text block. The suite calls it with
-- no `arguments` key at all, which ctx must treat as {}.

tool = {
    name = "test_simple_text",
    description = "Returns a simple text response (MCP conformance fixture).",
    annotations = { read_only = true, idempotent = true, open_world = false },
}

function tool.execute()
    return MCP.text("This is a simple text response for testing.")
end
