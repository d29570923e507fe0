-- kb_search: context.search from a Lua tool. Fixture for tests/clients/mcp_client.py.

tool = {
    name = "kb_search",
    version = "1.0.0",
    description = "Search the test knowledge base and return the titles of the matching documents.",
    parameters = {
        { name = "query", type = "string", required = true, description = "Words to search for, e.g. \"deploy\"" },
        { name = "limit", type = "integer", default = 5, description = "How many hits to return" },
    },
    annotations = { title = "Search the test docs", read_only = true, idempotent = true, open_world = false },
}

function tool.execute(params, context)
    local hits = context.search(params.query, { limit = params.limit })
    -- json.array() so that no hits come out as [] rather than {}.
    local titles = json.array()
    for _, hit in ipairs(hits) do
        titles[#titles + 1] = hit.title
    end
    return { query = params.query, count = #titles, titles = titles }
end
