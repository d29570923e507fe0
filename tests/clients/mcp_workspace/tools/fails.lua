-- fails: raises a Lua error, which ctx reports as an isError result with a sanitised message.
-- Fixture for tests/clients/mcp_client.py, which looks for "on purpose" in the text.

tool = {
    name = "fails",
    version = "1.0.0",
    description = "Always fails, on purpose: shows how a script error reaches an MCP client.",
    annotations = { read_only = true, idempotent = true, open_world = false },
}

function tool.execute()
    error("this tool fails on purpose")
end
