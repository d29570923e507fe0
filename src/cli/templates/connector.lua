-- {{name}}: a Lua connector. `ctx sync script:{{name}}` calls connector.scan(config, context) and
-- indexes the items it returns.
--
-- Return a list of items for a full scan: items missing from the next full scan are deleted from
-- the index. Or return { items = {...}, deleted = { "id", ... } } for an incremental scan: only
-- what changed since context.last_sync (nil on the first sync); every other document is kept.
-- context.state.get(key) / context.state.set(key, value) keep a small state (a cursor, at most
-- 64 KiB) for the next sync; it is saved only when this sync succeeds.
--
-- Host APIs: http.get/post/put/patch/delete/request, json.parse/encode, env.get, log.*, fs.read/list
-- (this folder only), base64, crypto.sha256/hmac_sha256, sleep, os.time/date/clock, require.
-- Their errors caught with pcall are strings like "{{name}}.lua:12: http.get: ...".

connector = {
    name = "{{name}}",
    version = "0.1.0",
    description = "Describe what this connector indexes",
}

function connector.scan(config, context)
    -- Example: fetch what changed since the last successful sync from an API given in the config.
    --   local since = context.last_sync or "1970-01-01T00:00:00Z"
    --   local ok, res = pcall(http.get, config.url .. "/items", { params = { updated_since = since } })
    --   if not ok then error("the API is down: " .. res) end
    --   if not res.ok then error("API returned " .. res.status) end
    --   ... build items from res.json ...
    --   return { items = items, deleted = res.json.deleted_ids }
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
    -- How many full scans ran, kept from one sync to the next.
    context.state.set("scans", (context.state.get("scans") or 0) + 1)
    return items
end
