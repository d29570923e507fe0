-- status-summary: what the status page says now: the overall indicator, the components that are
-- not operational, and the incidents still open. Read only.
local api = require("api")

tool = {
    name = "status-summary",
    version = "1.0.0",
    description = "The current status of the configured status page: overall indicator (none, minor, major, "
        .. "critical), components that are not operational, and unresolved incidents with their latest update.",
    parameters = {},
    annotations = { title = "Status page summary", read_only = true, open_world = true },
}

function tool.execute(params, context)
    local ok, summary = pcall(api.get, context.config, "summary.json")
    if not ok then
        return MCP.error("statuspage_unavailable", tostring(summary))
    end
    local degraded = json.array()
    for _, component in ipairs(summary.components or {}) do
        if component.status ~= "operational" and not component.group then
            degraded[#degraded + 1] = { name = component.name, status = component.status }
        end
    end
    local incidents = json.array()
    for _, incident in ipairs(summary.incidents or {}) do
        local latest = (incident.incident_updates or {})[1]
        incidents[#incidents + 1] = {
            name = incident.name,
            status = incident.status,
            impact = incident.impact,
            url = incident.shortlink,
            latest = latest and latest.body or nil,
        }
    end
    local status = summary.status or {}
    return {
        page = summary.page and summary.page.name or nil,
        indicator = status.indicator,
        description = status.description,
        degraded = degraded,
        incidents = incidents,
    }
end
