-- jira-create: files a new issue. Every call creates one, so agents should confirm first.
local common = require("common")

tool = {
    name = "jira-create",
    version = "1.0.0",
    description = "Create a Jira issue with a summary and a plain-text description. Files a new issue on "
        .. "every call, so confirm with the user first. Returns the issue key and URL.",
    parameters = {
        { name = "summary", type = "string", required = true, description = "One line" },
        { name = "description", type = "string", default = "", description = "Plain text; blank lines separate paragraphs" },
        { name = "project", type = "string", description = "Project key (default: the pack's project setting)" },
        { name = "issue_type", type = "string", default = "Task", description = "Task, Bug, Story, ..." },
    },
    annotations = { title = "Create Jira issue", read_only = false, destructive = false, idempotent = false, open_world = true },
}

-- Atlassian Document Format: one paragraph per blank-line-separated block.
local function document(text)
    local content = json.array()
    for block in (text:gsub("\r\n?", "\n") .. "\n\n"):gmatch("(.-)\n%s*\n") do
        if block:find("%S") then
            content[#content + 1] = { type = "paragraph", content = { { type = "text", text = block } } }
        end
    end
    return { type = "doc", version = 1, content = content }
end

function tool.execute(params, context)
    local config = context.config
    local problem = common.not_configured(config, "jira-create")
    if problem then
        return problem
    end
    local base = common.base(config)
    local project = common.present(params.project) or common.present(config.project) or "ENG"
    local fields = {
        project = { key = project },
        summary = params.summary,
        issuetype = { name = params.issue_type },
    }
    if params.description:find("%S") then
        fields.description = document(params.description)
    end
    local ok, resp = pcall(http.post, base .. "/rest/api/3/issue", { fields = fields }, {
        headers = common.headers(config),
        timeout = 20,
    })
    if not ok then
        return MCP.error(
            "jira_unreachable",
            "Could not reach Jira: " .. tostring(resp) .. ". The issue may or may not exist; check before retrying.",
            { url = base }
        )
    end
    if not resp.ok then
        return MCP.error("jira_http_" .. resp.status, "Jira returned HTTP " .. resp.status .. ": " .. common.reason(resp))
    end
    local key = type(resp.json) == "table" and common.present(resp.json.key)
    if not key then
        return MCP.error("jira_bad_response", "Jira answered without an issue key; check Jira before retrying.")
    end
    log.info("created " .. key)
    return { key = key, url = base .. "/browse/" .. key }
end
