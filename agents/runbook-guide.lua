-- runbook-guide: opens a conversation with the team's most relevant documents already loaded.
-- MCP clients list it as a prompt; REST serves it at POST /agents/runbook-guide/prompt.
--
--   [agents.script.runbook-guide]
--   path = "agents/runbook-guide.lua"
--   timeout = 10
--   documents = 3            # optional: how many documents to inject (config.documents)

agent = {
    name = "runbook-guide",
    description = "Answers how-to questions from the team's runbooks, with the top matching documents loaded.",
    tools = { "search", "get" },
    arguments = {
        { name = "question", description = "What you want to know, e.g. 'how do I roll back a deploy'", required = true },
    },
}

function agent.resolve(args, config, context)
    local wanted = tonumber(config.documents) or 3
    local hits = context.search(args.question, { limit = wanted * 2 })
    local messages, seen, titles = {}, {}, {}
    for _, hit in ipairs(hits) do
        if #titles >= wanted then break end
        if not seen[hit.id] then
            seen[hit.id] = true
            local doc = context.get(hit.id)
            if doc then
                titles[#titles + 1] = doc.title
                messages[#messages + 1] = {
                    role = "user",
                    content = "Document: " .. doc.title .. " (" .. doc.source .. ")\n\n" .. doc.body,
                }
            end
        end
    end
    local system = "You answer questions about how this team works, using the documents provided. "
        .. "Cite document titles. If they do not cover the question, say so and use the search tool."
    if #titles == 0 then
        system = system .. " No document matched the question; start with the search tool."
    end
    messages[#messages + 1] = { role = "user", content = args.question }
    return { system = system, messages = messages }
end
