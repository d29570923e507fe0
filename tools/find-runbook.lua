-- find-runbook: finds the runbook or how-to for an operational task in the knowledge base and
-- quotes the start of the best match, so an agent can often answer without a second call.
--
--   [tools.script.find-runbook]
--   path = "tools/find-runbook.lua"
--   timeout = 10
--
-- Read-only: it only searches and reads the index, and never reaches the network.

-- How much of the top document to quote, in characters.
local EXCERPT_CHARS = 400
-- The list form of `parameters` cannot state a range, so the limit is clamped here.
local MAX_LIMIT = 20

tool = {
    name = "find-runbook",
    version = "1.0.0",
    description = "Find the runbook or how-to for an operational task (deploys, rollbacks, incidents, "
        .. "on-call, access requests) in the knowledge base. Returns the best matches and the opening "
        .. "text of the top one; pass a result's id to get for the full document.",
    parameters = {
        {
            name = "query",
            type = "string",
            required = true,
            description = "The task or the symptom, in plain words, e.g. \"roll back a failed deploy\"",
        },
        { name = "limit", type = "integer", default = 3, description = "How many matches to return (1-20)" },
        {
            name = "source",
            type = "string",
            description = "Only search this source: \"filesystem:docs\", a type such as \"git\", or a name",
        },
    },
    annotations = { title = "Find runbook", read_only = true, idempotent = true, open_world = false },
    output_schema = {
        type = "object",
        required = { "query", "count", "results" },
        properties = {
            query = { type = "string" },
            count = { type = "integer" },
            results = {
                type = "array",
                items = {
                    type = "object",
                    required = { "id", "title", "score", "source", "snippet" },
                    properties = {
                        id = { type = "string" },
                        title = { type = "string" },
                        score = { type = "number" },
                        source = { type = "string" },
                        snippet = { type = "string" },
                        source_url = { type = "string" },
                    },
                },
            },
            top_excerpt = { type = "string" },
            hint = { type = "string" },
        },
    },
}

-- The body is the document as indexed, so a markdown file still starts with its front matter,
-- which says nothing useful to a reader.
local function strip_front_matter(text)
    return text:match("^%-%-%-\r?\n.-\n%-%-%-[ \t]*\r?\n(.*)$") or text
end

-- The first `max_chars` characters (not bytes, so UTF-8 is never cut in half), ending on a word
-- boundary when one is close to the cut.
local function excerpt(text, max_chars)
    text = strip_front_matter(text):gsub("^%s+", "")
    local cut = utf8.offset(text, max_chars + 1)
    if cut == nil then
        return (text:gsub("%s+$", ""))
    end
    local head = text:sub(1, cut - 1)
    local last_space = head:match("^.*()%s")
    if last_space and last_space > #head * 0.8 then
        head = head:sub(1, last_space - 1)
    end
    return head:gsub("%s+$", "") .. "…"
end

function tool.execute(params, context)
    local limit = math.max(1, math.min(params.limit, MAX_LIMIT))

    -- A query with no words in it (only punctuation, say) is an error from the index; report it
    -- as the caller's mistake instead of as a crash of the tool.
    local ok, hits = pcall(context.search, params.query, { limit = limit, source = params.source })
    if not ok then
        -- The first line only: a caught error may carry a traceback after it.
        local reason = tostring(hits):match("[^\n]*"):gsub("^runtime error: ", "")
        return MCP.error("search_failed", "Search failed: " .. reason, { query = params.query, source = params.source })
    end

    -- json.array() so that no matches come out as [] rather than {}.
    local results = json.array()
    for _, hit in ipairs(hits) do
        results[#results + 1] = {
            id = hit.id,
            title = hit.title,
            score = hit.score,
            source = hit.source,
            snippet = hit.snippet,
            source_url = hit.source_url, -- nil (left out) when the source has no web link
        }
    end

    local out = { query = params.query, count = #results, results = results }
    if #results == 0 then
        if params.source then
            out.hint = "No matches. Try other words, or search without the source filter."
        else
            out.hint = "No matches. Try other or fewer words; a trailing * matches a prefix (deploy*)."
        end
        return out
    end

    -- The index could have changed between the two calls; a missing document only costs the excerpt.
    local doc, err = context.get(results[1].id)
    if doc then
        out.top_excerpt = excerpt(doc.body, EXCERPT_CHARS)
    else
        log.warn("find-runbook: could not read the top match " .. results[1].id .. ": " .. tostring(err))
    end
    return out
end
