-- github-issues: indexes every issue of one repository (open and closed, pull requests left
-- out), one document per issue with its labels and state. A full scan: an issue deleted on
-- GitHub leaves the index at the next sync.
connector = {
    name = "github-issues",
    version = "1.0.0",
    description = "The issues of a GitHub repository",
}

local function present(value)
    if value == nil or value == json.null or value == "" then
        return nil
    end
    return value
end

function connector.scan(config, context)
    local repo = present(config.repo)
    if not repo or not tostring(repo):match("^[%w%.%-_]+/[%w%.%-_]+$") then
        error("set repo = \"owner/name\" in [connectors.script.github-issues] of ctx.toml")
    end
    local api = tostring(present(config.api_url) or "https://api.github.com"):gsub("/+$", "")
    local headers = { Accept = "application/vnd.github+json", ["X-GitHub-Api-Version"] = "2022-11-28" }
    if present(config.token) then
        headers.Authorization = "Bearer " .. config.token
    end
    local max_pages = tonumber(config.max_pages) or 20
    local items = {}
    for page = 1, max_pages do
        local resp = http.get(api .. "/repos/" .. repo .. "/issues", {
            params = { state = "all", per_page = "100", page = tostring(page), sort = "updated" },
            headers = headers,
            timeout = 30,
        })
        if not resp.ok then
            local message = type(resp.json) == "table" and resp.json.message or resp.body:sub(1, 200)
            error("GitHub returned HTTP " .. resp.status .. " for " .. repo .. ": " .. tostring(message))
        end
        local batch = resp.json or {}
        for _, issue in ipairs(batch) do
            -- The issues endpoint lists pull requests too; they are not issues.
            if issue.pull_request == nil then
                local labels = {}
                for _, label in ipairs(issue.labels or {}) do
                    labels[#labels + 1] = type(label) == "table" and label.name or tostring(label)
                end
                local author = type(issue.user) == "table" and issue.user.login or nil
                items[#items + 1] = {
                    source_id = "issue-" .. issue.number,
                    title = "#" .. issue.number .. " " .. tostring(issue.title),
                    body = tostring(present(issue.body) or "(no description)")
                        .. "\n\nState: " .. tostring(issue.state)
                        .. (#labels > 0 and ("\nLabels: " .. table.concat(labels, ", ")) or ""),
                    content_type = "text/markdown",
                    source_url = issue.html_url,
                    author = author,
                    created_at = issue.created_at,
                    updated_at = issue.updated_at,
                    metadata_json = { state = issue.state, labels = labels, number = issue.number },
                }
            end
        end
        if #batch < 100 then
            break
        end
    end
    log.info("indexed " .. #items .. " issue(s) of " .. repo)
    return items
end
