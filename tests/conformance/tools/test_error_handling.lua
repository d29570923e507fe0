-- Conformance fixture (scenario tools-call-error): a tool-level failure. The client must get a
-- normal result with isError true and a text block, not a JSON-RPC error.

tool = {
    name = "test_error_handling",
    description = "Always returns a tool error result (MCP conformance fixture).",
    annotations = { read_only = true, idempotent = true, open_world = false },
}

function tool.execute()
    return MCP.error("test_error", "This tool intentionally returns an error for testing")
end
