-- slow: never returns. ctx.toml gives it `timeout = 1`, so ctx stops it after a second and the
-- client gets an isError result saying it timed out. Fixture for tests/clients/mcp_client.py,
-- which then checks that the server still answers.

tool = {
    name = "slow",
    version = "1.0.0",
    description = "Loops until its deadline: shows what a client sees when a tool times out.",
    annotations = { read_only = true, idempotent = true, open_world = false },
}

function tool.execute()
    while true do
    end
end
