-- {{name}}: a Lua tool. Agents find it in the tool list and call it with JSON parameters; ctx
-- checks them against `parameters`, fills in defaults, then calls tool.execute(params, context).
--
--   [tools.script.{{name}}]
--   path = "tools/{{name}}.lua"
--   # allow_hosts = ["api.example.com"]   # optional: the only hosts http.* may reach
--   # token = "${API_TOKEN}"               # any other key shows up in context.config
--
-- context: search(query, opts), get(id), sources(), config. Host APIs: http.*, json, log, env.get,
-- fs.read/list (this folder only), base64, crypto, sleep, require. Results: return a table, or
-- MCP.error(code, message) for a failure the caller should see. progress(done, total, message)
-- reports progress when the client asked for it.

tool = {
    name = "{{name}}",
    version = "0.1.0",
    -- Agents pick tools by their description: say what the tool does and when to call it.
    description = "Search the knowledge base and list the matching documents. Replace this with what your tool does.",
    parameters = {
        { name = "query", type = "string", required = true, description = "What to look for" },
        { name = "limit", type = "integer", default = 5, description = "How many results to return (1-50)" },
    },
    -- Hints for clients. A tool that changes things elsewhere: read_only = false, open_world = true.
    annotations = { read_only = true, idempotent = true, open_world = false },
}

function tool.execute(params, context)
    -- The list form cannot express a range, so keep the limit sane here.
    local limit = math.max(1, math.min(params.limit, 50))

    -- Options: mode = "keyword" | "semantic" | "hybrid", limit, source = "filesystem:docs",
    -- since = "2024-01-01".
    local hits = context.search(params.query, { limit = limit })

    -- json.array() so that no hits come out as [] rather than {}.
    local results = json.array()
    for _, hit in ipairs(hits) do
        results[#results + 1] = { id = hit.id, title = hit.title, score = hit.score, snippet = hit.snippet }
    end

    -- Any table that maps to JSON is a result. An error("...") would be reported as a failed call
    -- with the script's line number; MCP.error is for failures you expect and can explain.
    return { query = params.query, count = #results, results = results }
end
