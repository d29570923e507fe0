-- Shared by the jira pack's tools: the settings check, the auth header and Jira's error text.
local M = {}

-- A missing value can be nil, "" (an empty ${VAR}) or json.null.
function M.present(value)
    if value == nil or value == json.null or value == "" then
        return nil
    end
    return value
end

-- nil when url, email and api_token are set; otherwise an MCP error that says what to add.
function M.not_configured(config, section)
    local missing = {}
    for _, key in ipairs({ "url", "email", "api_token" }) do
        if not M.present(config[key]) then
            missing[#missing + 1] = key
        end
    end
    if #missing == 0 then
        return nil
    end
    return MCP.error(
        "not_configured",
        "Jira is not configured: set " .. table.concat(missing, ", ") .. " in [tools.script." .. section .. "] of ctx.toml",
        { missing = missing }
    )
end

function M.base(config)
    return (tostring(config.url):gsub("/+$", ""))
end

function M.headers(config)
    return {
        Authorization = "Basic " .. base64.encode(config.email .. ":" .. config.api_token),
        Accept = "application/json",
    }
end

-- Jira explains failures as {"errorMessages": [...], "errors": {"field": "message"}}.
function M.reason(resp)
    local reasons = {}
    if type(resp.json) == "table" then
        if type(resp.json.errorMessages) == "table" then
            for _, message in ipairs(resp.json.errorMessages) do
                reasons[#reasons + 1] = tostring(message)
            end
        end
        if type(resp.json.errors) == "table" then
            local fields = {}
            for field in pairs(resp.json.errors) do
                fields[#fields + 1] = tostring(field)
            end
            table.sort(fields)
            for _, field in ipairs(fields) do
                reasons[#reasons + 1] = field .. ": " .. tostring(resp.json.errors[field])
            end
        end
    end
    if #reasons == 0 then
        return resp.body:sub(1, 200)
    end
    return table.concat(reasons, "; ")
end

return M
