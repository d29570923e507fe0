-- jira-search: issues that match a JQL query, newest first, with their key, summary, status and
-- link. Read only.
local common = require("common")

tool = {
    name = "jira-search",
    version = "1.0.0",
    description = "Search Jira issues with a JQL query (e.g. 'project = ENG AND text ~ \"login\"'). "
        .. "Returns each issue's key, summary, status, assignee and URL.",
    parameters = {
        { name = "jql", type = "string", required = true, description = "The JQL query" },
        { name = "limit", type = "integer", default = 10, description = "At most this many issues (1 to 50)" },
    },
    annotations = { title = "Search Jira", read_only = true, open_world = true },
}

function tool.execute(params, context)
    local config = context.config
    local problem = common.not_configured(config, "jira-search")
    if problem then
        return problem
    end
    local base = common.base(config)
    local ok, resp = pcall(http.get, base .. "/rest/api/3/search/jql", {
        params = {
            jql = params.jql,
            maxResults = tostring(math.max(1, math.min(50, params.limit))),
            fields = "summary,status,assignee,updated",
        },
        headers = common.headers(config),
        timeout = 20,
    })
    if not ok then
        return MCP.error("jira_unreachable", "Could not reach Jira: " .. tostring(resp), { url = base })
    end
    if not resp.ok then
        return MCP.error("jira_http_" .. resp.status, "Jira returned HTTP " .. resp.status .. ": " .. common.reason(resp))
    end
    local issues = json.array()
    for _, issue in ipairs((resp.json or {}).issues or {}) do
        local fields = issue.fields or {}
        local status = type(fields.status) == "table" and fields.status.name or nil
        local assignee = type(fields.assignee) == "table" and fields.assignee.displayName or nil
        issues[#issues + 1] = {
            key = issue.key,
            summary = fields.summary,
            status = status,
            assignee = assignee,
            updated = common.present(fields.updated),
            url = base .. "/browse/" .. issue.key,
        }
    end
    return { issues = issues, count = #issues }
end
