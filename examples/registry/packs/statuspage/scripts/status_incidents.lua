-- status-incidents: indexes the page's incidents (the last 50 the API lists), one document each,
-- with every update in order, so "when was the last outage of X" is a search away.
local api = require("api")

connector = {
    name = "status-incidents",
    version = "1.0.0",
    description = "Incidents of a status page",
}

function connector.scan(config, context)
    local data = api.get(config, "incidents.json")
    local items = {}
    for _, incident in ipairs(data.incidents or {}) do
        local lines = {
            "Impact: " .. tostring(incident.impact) .. ". Status: " .. tostring(incident.status) .. ".",
        }
        local components = {}
        for _, component in ipairs(incident.components or {}) do
            components[#components + 1] = component.name
        end
        if #components > 0 then
            lines[#lines + 1] = "Components: " .. table.concat(components, ", ") .. "."
        end
        -- The API lists updates newest first; a document reads better oldest first.
        local updates = incident.incident_updates or {}
        for i = #updates, 1, -1 do
            local update = updates[i]
            lines[#lines + 1] = tostring(update.created_at) .. " " .. tostring(update.status) .. ": " .. tostring(update.body)
        end
        items[#items + 1] = {
            source_id = tostring(incident.id),
            title = tostring(incident.name),
            body = table.concat(lines, "\n"),
            source_url = incident.shortlink,
            created_at = incident.created_at,
            updated_at = incident.updated_at or incident.created_at,
            metadata_json = { impact = incident.impact, status = incident.status },
        }
    end
    return items
end
