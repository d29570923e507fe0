-- echo: returns what it is given. The smallest useful tool, handy for checking a setup.
--
--   [tools.script.echo]
--   path = "tools/echo.lua"
--   greeting = "hello"        # optional; any extra key shows up in context.config

tool = {
    name = "echo",
    version = "1.0.0",
    description = "Echo a message back, with an optional greeting from the tool's config.",
    parameters = {
        { name = "message", type = "string", required = true, description = "Text to echo back" },
        { name = "repeat", type = "integer", required = false, default = 1, description = "How many times to repeat it" },
    },
    annotations = { read_only = true, idempotent = true, open_world = false },
}

function tool.execute(params, context)
    local parts = {}
    for _ = 1, params["repeat"] do
        parts[#parts + 1] = params.message
    end
    return {
        message = table.concat(parts, " "),
        greeting = context.config.greeting,
    }
end
