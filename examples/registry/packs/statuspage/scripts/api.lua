-- Shared by the statuspage pack's scripts: GET one document of the page's v2 API.
local M = {}

function M.get(config, document)
    local page = config.page_url
    if page == nil or page == json.null or page == "" then
        error("set page_url in the pack's section of ctx.toml, e.g. page_url = \"https://yourcompany.statuspage.io\"")
    end
    local url = tostring(page):gsub("/+$", "") .. "/api/v2/" .. document
    local resp = http.get(url, { headers = { Accept = "application/json" }, timeout = 15 })
    if not resp.ok or type(resp.json) ~= "table" then
        error("the status page answered HTTP " .. resp.status .. " for " .. url)
    end
    return resp.json
end

return M
