-- create-jira-ticket: opens a Jira Cloud issue, optionally with links to related documentation
-- from the knowledge base appended to the description.
--
--   [tools.script.create-jira-ticket]
--   path = "tools/create-jira-ticket.lua"
--   timeout = 30
--   allow_hosts = ["mycompany.atlassian.net"]   # http.* may reach this host and no other
--   url = "https://mycompany.atlassian.net"
--   email = "bot@mycompany.com"                 # the Atlassian account the issues are filed as
--   api_token = "${JIRA_API_TOKEN}"             # an API token of that account
--   # issue_type = "Task"                       # optional, default "Task"
--
-- Every call files a new issue: agents should confirm with the user before calling it.

local DEFAULT_ISSUE_TYPE = "Task"
-- Hits to look up for the "Related documentation" section.
local RELATED_LIMIT = 3
-- Below the default 30 s tool deadline, so a Jira that hangs becomes an error this script can
-- report; a request cut short by the deadline itself stops the whole run instead.
local HTTP_TIMEOUT = 20
-- How much of a Jira error response to pass back, in characters.
local ERROR_BODY_CHARS = 2000
local ERROR_SUMMARY_CHARS = 200

tool = {
    name = "create-jira-ticket",
    version = "1.0.0",
    description = "Create a Jira issue with a title and a description, optionally followed by links to "
        .. "related documentation from the knowledge base. Files a new issue on every call, so confirm "
        .. "with the user first. Returns the issue key and URL.",
    parameters = {
        { name = "title", type = "string", required = true, description = "Issue summary, one line" },
        {
            name = "body",
            type = "string",
            required = true,
            description = "Issue description as plain text; blank lines separate paragraphs",
        },
        { name = "project", type = "string", default = "ENG", description = "Jira project key" },
        {
            name = "priority",
            type = "string",
            default = "Medium",
            enum = { "Lowest", "Low", "Medium", "High", "Highest" },
            description = "Issue priority",
        },
        {
            name = "labels",
            type = "array",
            items = { type = "string" },
            description = "Labels to set; Jira labels cannot contain spaces",
        },
        {
            name = "enrich",
            type = "boolean",
            default = true,
            description = "Search the knowledge base for the title and append links to related documentation",
        },
    },
    annotations = {
        title = "Create Jira ticket",
        read_only = false,
        destructive = false,
        idempotent = false,
        open_world = true,
    },
}

-- A missing value can arrive as nil, as "" (an empty ${VAR}), or, when it went through JSON, as
-- json.null (which is truthy).
local function present(value)
    if value == nil or value == json.null or value == "" then
        return nil
    end
    return value
end

-- At most `max_chars` characters, cut on a character boundary when the text is valid UTF-8 (an
-- error page need not be).
local function clip(text, max_chars)
    local cut
    if utf8.len(text) then
        cut = utf8.offset(text, max_chars + 1)
    elseif #text > max_chars then
        cut = max_chars + 1
    end
    if not cut then
        return text
    end
    return text:sub(1, cut - 1) .. "…"
end

-- The message of a caught error, without the traceback that may follow it.
local function first_line(err)
    return (tostring(err):match("[^\n]*"):gsub("^runtime error: ", ""))
end

local function not_configured(config)
    local missing = {}
    for _, key in ipairs({ "url", "email", "api_token" }) do
        if not present(config[key]) then
            missing[#missing + 1] = key
        end
    end
    if #missing == 0 then
        return nil
    end
    return MCP.error(
        "not_configured",
        "Jira is not configured: add " .. table.concat(missing, ", ") .. " to [tools.script." .. tool.name
            .. "] in ctx.toml, e.g. url = \"https://mycompany.atlassian.net\", email = \"bot@mycompany.com\", "
            .. "api_token = \"${JIRA_API_TOKEN}\"",
        { missing = missing }
    )
end

-- Distinct documents among the hits for the title, best first. Several chunks of one document can
-- match, and a ticket should link each document once.
local function related_documents(context, title)
    -- The ticket matters more than its links: if the search fails (a title with no words in it,
    -- say), file the ticket without them.
    local ok, hits = pcall(context.search, title, { limit = RELATED_LIMIT })
    if not ok then
        log.warn("related documentation skipped: " .. first_line(hits))
        return {}
    end
    local docs, seen = {}, {}
    for _, hit in ipairs(hits) do
        if not seen[hit.id] then
            seen[hit.id] = true
            docs[#docs + 1] = hit
        end
    end
    return docs
end

-- Jira Cloud's v3 API takes descriptions in Atlassian Document Format, not markdown or plain text.
local function text_node(text, marks)
    return { type = "text", text = text, marks = marks }
end

-- One paragraph per blank-line-separated block, with its line breaks kept as hardBreak nodes.
-- (ADF refuses empty text nodes, so blank lines never become nodes.)
local function paragraphs(text)
    local blocks = json.array()
    text = text:gsub("\r\n?", "\n") .. "\n\n"
    for block in text:gmatch("(.-)\n%s*\n") do
        local content = json.array()
        for line in block:gmatch("[^\n]+") do
            if line:find("%S") then
                if #content > 0 then
                    content[#content + 1] = { type = "hardBreak" }
                end
                content[#content + 1] = text_node(line)
            end
        end
        if #content > 0 then
            blocks[#blocks + 1] = { type = "paragraph", content = content }
        end
    end
    return blocks
end

local function related_section(docs)
    local items = json.array()
    for _, doc in ipairs(docs) do
        local title = present(doc.title) or doc.id
        local url = present(doc.source_url)
        local label
        -- Jira rejects the whole issue over a link it cannot use, and a source_url is not always a
        -- web address, so only http(s) URLs become links.
        if url and url:match("^https?://") then
            label = text_node(title, { { type = "link", attrs = { href = url } } })
        else
            label = text_node(title)
        end
        items[#items + 1] = {
            type = "listItem",
            content = { { type = "paragraph", content = { label, text_node(" (" .. doc.source .. ")") } } },
        }
    end
    return {
        { type = "paragraph", content = { text_node("Related documentation", { { type = "strong" } }) } },
        { type = "bulletList", content = items },
    }
end

-- Jira explains failures as {"errorMessages": [...], "errors": {"field": "message"}}; fall back to
-- the start of the raw body.
local function jira_reason(resp)
    local reasons = {}
    local body = resp.json
    if type(body) == "table" then
        if type(body.errorMessages) == "table" then
            for _, message in ipairs(body.errorMessages) do
                reasons[#reasons + 1] = tostring(message)
            end
        end
        if type(body.errors) == "table" then
            local fields = {}
            for field in pairs(body.errors) do
                fields[#fields + 1] = tostring(field)
            end
            table.sort(fields)
            for _, field in ipairs(fields) do
                reasons[#reasons + 1] = field .. ": " .. tostring(body.errors[field])
            end
        end
    end
    -- Clipped before the whitespace is squeezed, so a huge error page costs little.
    local reason = #reasons > 0 and table.concat(reasons, "; ") or clip(resp.body, ERROR_SUMMARY_CHARS * 4)
    reason = reason:gsub("%s+", " "):match("^ ?(.-) ?$")
    if reason == "" then
        reason = "no details in the response"
    end
    if resp.status == 401 then
        reason = reason .. " (check email and api_token in ctx.toml)"
    end
    return clip(reason, ERROR_SUMMARY_CHARS)
end

function tool.execute(params, context)
    local config = context.config
    local problem = not_configured(config)
    if problem then
        return problem
    end
    local base = tostring(config.url):gsub("/+$", "")

    local labels = params.labels
    if labels then
        for _, label in ipairs(labels) do
            if label:find("%s") then
                return MCP.error("invalid_label", "Jira labels cannot contain spaces: \"" .. label .. "\"")
            end
        end
    end

    local description = paragraphs(params.body)
    local related = {}
    if params.enrich then
        progress(0, 2, "Looking up related documentation")
        related = related_documents(context, params.title)
        if #related > 0 then
            description[#description + 1] = { type = "rule" }
            for _, node in ipairs(related_section(related)) do
                description[#description + 1] = node
            end
        end
    end

    progress(1, 2, "Creating the Jira issue")
    local fields = {
        project = { key = params.project },
        summary = params.title,
        -- An empty document says nothing; leave the field out instead.
        description = #description > 0 and { type = "doc", version = 1, content = description } or nil,
        issuetype = { name = present(config.issue_type) or DEFAULT_ISSUE_TYPE },
        priority = { name = params.priority },
        -- json.array: an empty list must still go out as [] rather than {}.
        labels = labels and json.array(labels),
    }
    -- A table body goes out as JSON with content-type application/json.
    local ok, resp = pcall(http.post, base .. "/rest/api/3/issue", { fields = fields }, {
        headers = {
            Authorization = "Basic " .. base64.encode(config.email .. ":" .. config.api_token),
            Accept = "application/json",
        },
        timeout = HTTP_TIMEOUT,
    })
    if not ok then
        -- After a timeout the issue may exist all the same; a blind retry could file it twice.
        return MCP.error(
            "jira_unreachable",
            "Could not reach Jira: " .. first_line(resp)
                .. ". The issue may or may not have been created; check Jira before trying again.",
            { url = base }
        )
    end

    if not resp.ok then
        return MCP.error(
            "jira_http_" .. resp.status,
            "Jira returned HTTP " .. resp.status .. ": " .. jira_reason(resp),
            { status = resp.status, body = clip(resp.body, ERROR_BODY_CHARS) }
        )
    end

    local key = type(resp.json) == "table" and present(resp.json.key)
    if not key then
        return MCP.error(
            "jira_bad_response",
            "Jira answered HTTP " .. resp.status .. " without an issue key; check Jira before trying again.",
            { status = resp.status, body = clip(resp.body, ERROR_BODY_CHARS) }
        )
    end

    log.info("created " .. key .. ": " .. params.title)
    progress(2, 2, "Created " .. key)
    return { key = key, url = base .. "/browse/" .. key, related = #related }
end
