-- steps: reports progress after each step, then answers. With an MCP progressToken every
-- progress() call becomes a notifications/progress. Fixture for tests/clients/mcp_client.py.

tool = {
    name = "steps",
    version = "1.0.0",
    description = "Counts through a few short steps and reports progress after each one.",
    parameters = {
        { name = "count", type = "integer", default = 3, description = "How many steps" },
        { name = "delay", type = "number", default = 0.1, description = "Seconds each step takes" },
    },
    annotations = { read_only = true, idempotent = true, open_world = false },
}

function tool.execute(params)
    for i = 1, params.count do
        sleep(params.delay)
        progress(i, params.count, "step " .. i .. " of " .. params.count)
    end
    return MCP.text("done after " .. params.count .. " steps")
end
