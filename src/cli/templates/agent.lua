-- {{name}}: a Lua agent. MCP clients show it as a prompt; REST serves it at
-- POST /agents/{{name}}/prompt. resolve() runs in the same sandbox as tools, once per request.
--
--   [agents.script.{{name}}]
--   path = "agents/{{name}}.lua"
--   timeout = 10
--   # any other key becomes the `config` argument of resolve()

agent = {
    name = "{{name}}",
    description = "What this agent helps with, in one line.",
    tools = { "search", "get" },
    arguments = {
        { name = "topic", description = "What the user wants help with", required = true },
    },
}

function agent.resolve(args, config, context)
    -- Pre-load the knowledge the conversation starts from.
    local hits = context.search(args.topic, { limit = 3 })
    local messages = {}
    for _, hit in ipairs(hits) do
        local doc = context.get(hit.id)
        if doc then
            messages[#messages + 1] = { role = "user", content = "# " .. doc.title .. "\n\n" .. doc.body }
        end
    end
    return {
        system = "You help the team with " .. args.topic .. ". Use the documents below; cite their titles.",
        messages = messages,
    }
end
