-- {{name}}: a Lua connector. `ctx sync script:{{name}}` calls connector.scan(config) and indexes
-- the items it returns. Items missing from the next scan are deleted from the index.
--
-- Host APIs: http.get/post/put/patch/delete/request, json.parse/encode, env.get, log.*, fs.read/list
-- (this folder only), base64, crypto.sha256/hmac_sha256, sleep, os.time/date/clock, require.

connector = {
    name = "{{name}}",
    version = "0.1.0",
    description = "Describe what this connector indexes",
}

function connector.scan(config)
    -- Example: fetch from an API given in the config section.
    --   local res = http.get(config.url .. "/items", { headers = { Authorization = "Bearer " .. config.token } })
    --   if not res.ok then error("API returned " .. res.status) end
    local items = {}
    items[#items + 1] = {
        source_id = "example-1",                 -- required: stable id within this connector
        title = "Example item",
        body = "Replace this with text fetched from your system.", -- required
        content_type = "text/plain",
        source_url = "https://example.com/items/1",
        author = "someone",
        updated_at = os.time(),                  -- unix seconds or an ISO 8601 string
    }
    return items
end
