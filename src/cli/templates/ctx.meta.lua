---@meta
-- Definitions of what ctx gives its Lua 5.4 scripts, for the Lua language server (LuaLS):
-- completion, hover docs and type checks in an editor. ctx never runs this file.
--
-- Keep it next to your scripts, or list its folder in `.luarc.json`:
--   {
--     "runtime.version": "Lua 5.4",
--     "runtime.builtin": { "io": "disable", "debug": "disable", "package": "disable", "os": "disable" },
--     "workspace.library": ["path/to/this/folder"]
--   }
-- The sandbox has no `io`, `debug` or `package`, and keeps only four `os` functions (declared
-- below), hence the "disable"s. It also has no `dofile`, `loadfile` or `string.dump`; `load`
-- takes text chunks only; `collectgarbage` keeps "collect", "count", "step" and "isrunning";
-- `__gc` finalizers are refused.
--
-- Host functions raise ordinary Lua errors: catch them with pcall, and the error is a plain string
-- that starts with your script's file and line and the function's name
-- ("jira.lua:12: http.get: ..."), so `"down: " .. err` works. Uncaught, the same message reaches
-- the caller. Running out of time or memory, or the caller cancelling, stops the script whatever
-- it does: pcall cannot catch that.
--
-- A script file may start with a UTF-8 byte order mark or a `#!` line, as `lua` itself allows;
-- line numbers in messages stay those of the file.
--
-- An empty table `{}` is an empty list wherever ctx expects a list: `parameters = {}`,
-- `arguments = {}`, and `messages = {}` or `tools = {}` in what `agent.resolve` returns. Where
-- any JSON is allowed (a tool's result), `{}` stays an empty object: use `json.array()` for `[]`.

---JSON `null`. A light userdata, so it is truthy: compare with `json.null` to detect it.
---@alias ctx.Null lightuserdata

-- ---------------------------------------------------------------------------------------------
-- http

---Options shared by every `http` function.
---@class ctx.HttpOptions
---Request headers. A table body adds `content-type: application/json` unless one is set here.
---@field headers? table<string, string|number|boolean>
---Query parameters, appended to the URL (URL-encoded, in name order).
---@field params? table<string, string|number|boolean>
---Seconds (fractions allowed, > 0) before the request fails with a catchable error. Default 30. It
---never runs past the script's own deadline; when the deadline is what cuts a request short, the
---whole run stops instead.
---@field timeout? number

---The single argument of `http.request`.
---@class ctx.HttpRequest: ctx.HttpOptions
---HTTP method, any case. Default "GET".
---@field method? string
---An `http://` or `https://` URL.
---@field url string
---A string is sent as is; a table is sent as JSON.
---@field body? string|table

---What every `http` function returns, whatever the status: only a failed or refused request
---raises an error.
---@class ctx.HttpResponse
---The HTTP status code.
---@field status integer
---True for a 2xx status.
---@field ok boolean
---Response headers, names in lower case. A repeated header keeps its last value.
---@field headers table<string, string>
---The raw body.
---@field body string
---The parsed body, when it is valid JSON and either the content type mentions json or the body
---starts with `{` or `[`; nil otherwise. JSON null appears as `json.null`.
---@field json? any

---HTTP client. When the script's section sets `allow_hosts`, only those hosts (exact names,
---`*.example.com`, IP addresses or CIDR ranges) may be reached, on every redirect too; headers the
---script set are not sent to another origin after a redirect. Private, loopback and link-local
---addresses are refused unless an exact `allow_hosts` entry or range names them or the section
---sets `allow_private = true`. Raises an error for an invalid URL, a scheme other than
---http/https, a host or address not allowed, a connection failure, a timeout, more than 10
---redirects, or a body larger than the script's memory limit; never for an HTTP status.
http = {}

---@param url string
---@param opts? ctx.HttpOptions
---@return ctx.HttpResponse
function http.get(url, opts) end

---@param url string
---@param opts? ctx.HttpOptions
---@return ctx.HttpResponse
function http.delete(url, opts) end

---@param url string
---@param body string|table|nil A string is sent as is; a table is sent as JSON (with `content-type: application/json` unless `opts.headers` sets one); nil sends an empty body.
---@param opts? ctx.HttpOptions
---@return ctx.HttpResponse
function http.post(url, body, opts) end

---@param url string
---@param body string|table|nil A string is sent as is; a table is sent as JSON (with `content-type: application/json` unless `opts.headers` sets one); nil sends an empty body.
---@param opts? ctx.HttpOptions
---@return ctx.HttpResponse
function http.put(url, body, opts) end

---@param url string
---@param body string|table|nil A string is sent as is; a table is sent as JSON (with `content-type: application/json` unless `opts.headers` sets one); nil sends an empty body.
---@param opts? ctx.HttpOptions
---@return ctx.HttpResponse
function http.patch(url, body, opts) end

---Any method: `http.request{ method = "HEAD", url = "...", headers = {...} }`.
---@param request ctx.HttpRequest
---@return ctx.HttpResponse
function http.request(request) end

-- ---------------------------------------------------------------------------------------------
-- json

---JSON text and Lua values. An empty table encodes as `{}`; use `json.array()` for `[]`. A table
---whose keys are exactly 1..n encodes as an array, any other keys make an object (keys sorted).
---Arrays decoded by `json.parse` remember that they are arrays, so they round-trip even when empty.
json = {}

---Parses JSON text. Objects become tables, arrays become marked tables, null becomes `json.null`.
---Raises an error on invalid JSON.
---@param text string
---@return any
function json.parse(text) end

---Encodes a value as compact JSON text. Raises an error for functions and other userdata, NaN or
---infinite numbers, table keys that are not strings or numbers, nesting deeper than 128 levels
---(which also catches cycles), or output larger than the script's memory limit.
---@param value any
---@return string
function json.encode(value) end

---The JSON `null` value. It encodes as `null`, and `null` decodes to it.
---@type ctx.Null
json.null = nil

---Marks `t` (or a new empty table) as a JSON array, so it encodes as `[]` even when empty, and
---returns it.
---@generic T: table
---@param t T
---@return T
---@overload fun(): table
function json.array(t) end

-- ---------------------------------------------------------------------------------------------
-- log, print

---Logging to ctx's log (stderr), tagged with the script's kind and name. Arguments are joined
---with spaces.
log = {}

---@param ... any
function log.debug(...) end

---@param ... any
function log.info(...) end

---@param ... any
function log.warn(...) end

---@param ... any
function log.error(...) end

---Same as `log.info`: it writes to the log, never to stdout (which belongs to the CLI's output and
---the MCP stdio transport).
---@param ... any
function print(...) end

-- ---------------------------------------------------------------------------------------------
-- env

---Read-only access to the process environment. Secrets are better put in the script's config
---section as `"${VAR}"`, which reaches the script as `config` / `context.config`.
env = {}

---The value of an environment variable, or nil when it is not set. Raises an error unless the
---script's section lists `name` in `allow_env`, and always for a variable ctx itself uses for a
---secret (the `${VAR}` of server.auth_token or of another section).
---@param name string
---@return string?
function env.get(name) end

-- ---------------------------------------------------------------------------------------------
-- fs

---Read-only files from the script's own folder. Paths are relative to that folder and resolved
---(`..` and symlinks included) before the check, so nothing outside it can be reached.
fs = {}

---The whole content of a file. Raises an error for an absolute path, a path outside the script's
---folder, a missing file or a folder, or a file larger than the script's memory limit.
---@param path string
---@return string
function fs.read(path) end

---The names (not paths) of the entries of a folder, files and folders alike, sorted.
---@param dir? string Default ".", the script's folder.
---@param glob? string Keeps only names matching this glob, e.g. "*.md".
---@return string[]
function fs.list(dir, glob) end

-- ---------------------------------------------------------------------------------------------
-- base64, crypto

---Base64 with the standard alphabet and padding.
base64 = {}

---@param data string Any bytes.
---@return string
function base64.encode(data) end

---Decodes base64 text (surrounding whitespace is ignored). Raises an error on invalid input.
---@param text string
---@return string bytes
function base64.decode(text) end

---Hashes, as lower-case hex.
crypto = {}

---@param data string
---@return string hex
function crypto.sha256(data) end

---@param key string
---@param data string
---@return string hex
function crypto.hmac_sha256(key, data) end

-- ---------------------------------------------------------------------------------------------
-- sleep, require, os

---Pauses the script. It never sleeps past the script's deadline and wakes up early when the caller
---cancels. Raises an error for a negative or non-finite number.
---@param seconds number
function sleep(seconds) end

---Loads `name.lua` from the script's own folder, dots becoming folders ("lib.util" is
---lib/util.lua), in the same sandbox, once per run. Returns what the module returns, or true when
---it returns nothing.
---@param name string Letters, digits, "_" and "-" between dots.
---@return any
function require(name) end

---The sandbox keeps only these four functions of `os`.
os = {}

---The current time as unix seconds, or the time described by `t`.
---@param t? table Fields year, month and day; hour, min, sec and isdst are optional.
---@return integer
function os.time(t) end

---CPU time used by the process, in seconds.
---@return number
function os.clock() end

---Formats a time (default: now); "!" at the start of `format` means UTC, "*t" returns a table.
---@param format? string
---@param time? integer
---@return string|table
function os.date(format, time) end

---@param t2 integer
---@param t1 integer
---@return number seconds
function os.difftime(t2, t1) end

-- ---------------------------------------------------------------------------------------------
-- Knowledge base values

---@alias ctx.SearchMode
---| "keyword" # full-text BM25 (the default)
---| "semantic" # vector similarity; an error without an embedding provider
---| "hybrid" # both, blended; falls back to keyword without an embedding provider

---One matching chunk of a document. Results come best first.
---@class ctx.SearchHit
---Document id: pass it to `context.get`.
---@field id string
---Which chunk of the document matched, from 0.
---@field chunk_index integer
---Relevance, higher is better; comparable between results of one search only.
---@field score number
---@field title string
---Matching text with the hits wrapped in « and ».
---@field snippet string
---The source, as type:name (e.g. "filesystem:docs").
---@field source string
---Web link to the original, when the source has one.
---@field source_url? string
---When the document last changed (RFC 3339, UTC).
---@field updated_at string

---One searchable piece of a document.
---@class ctx.Chunk
---Position within the document, from 0.
---@field index integer
---The chunk's text, including any overlap with the previous chunk.
---@field text string
---Estimated token count.
---@field tokens integer

---A whole indexed document.
---@class ctx.Document
---Stable id, derived from source and source_id.
---@field id string
---The source, as type:name.
---@field source string
---The document's id within its source, e.g. a relative path.
---@field source_id string
---@field title string
---The full text, as indexed.
---@field body string
---MIME type, e.g. "text/markdown".
---@field content_type string
---@field source_url? string
---@field author? string
---RFC 3339, UTC.
---@field created_at string
---RFC 3339, UTC.
---@field updated_at string
---Source-specific metadata (any JSON).
---@field metadata? any
---SHA-256 (hex) over the indexed fields.
---@field content_hash string
---The document's chunks, in order.
---@field chunks ctx.Chunk[]

---A configured connector, or an indexed source no longer configured.
---@class ctx.SourceStatus
---As type:name: the value for search's `source` filter.
---@field name string
---@field type "filesystem"|"git"|"script"
---Whether ctx.toml still configures this source.
---@field configured boolean
---False when the last sync failed or the source cannot be reached.
---@field healthy boolean
---Why the source is unhealthy, or other remarks.
---@field notes? string
---@field documents integer
---@field chunks integer
---When the last sync finished (RFC 3339, UTC); nil if never.
---@field last_sync? string
---The error of the last sync, if it failed.
---@field last_error? string

-- ---------------------------------------------------------------------------------------------
-- Tools

---@class ctx.SearchOptions
---Default "keyword".
---@field mode? ctx.SearchMode
---How many results: 1 to retrieval.max_limit (100 unless configured); more is an error.
---Default: retrieval.default_limit (12).
---@field limit? integer
---Only this source: "filesystem:docs", a type ("git") or a name ("docs").
---@field source? string
---Only documents updated on or after this date: "YYYY-MM-DD" or RFC 3339.
---@field since? string
---Accepted, but has no effect here: only the hits are returned.
---@field explain? boolean

---Keys nested under `filters` are read as if they were options.
---@class ctx.SearchFilters
---@field source? string
---@field since? string

---The table form of `context.search`.
---@class ctx.SearchRequest: ctx.SearchOptions
---Words to look for. Any text works; a trailing * makes a word a prefix (deploy*).
---@field query string
---@field filters? ctx.SearchFilters

---The second argument of `tool.execute`: the knowledge base and the tool's configuration.
---@class ctx.Context
---The extra keys of the tool's `[tools.script.<name>]` section (everything but path, timeout,
---memory_mb, max_result_bytes, allow_hosts and allow_env), with `${VAR}` already expanded.
---@field config table<string, any>
local Context = {}

---Searches the knowledge base, best hits first. Raises an error ("context.search: ...") for an
---invalid request: an unknown option, a limit out of range, a query with no words in it.
---@param query string Words to look for. Any text works; a trailing * makes a word a prefix.
---@param opts? ctx.SearchOptions
---@return ctx.SearchHit[]
---@overload fun(request: ctx.SearchRequest): ctx.SearchHit[]
function Context.search(query, opts) end

---A whole document by id (a search hit's `id`), or nil and a message ("no document with id ...")
---when there is none. Raises an error when `id` is not a string.
---@param id string
---@return ctx.Document? document
---@return string? message
function Context.get(id) end

---The configured sources and the state of their index.
---@return ctx.SourceStatus[]
function Context.sources() end

---@alias ctx.ParamType "string"|"integer"|"number"|"boolean"|"array"|"object"

---One parameter in the list form of `tool.parameters`.
---@class ctx.ParamSpec
---The JSON key: a letter or "_", then letters, digits, "_", "." or "-".
---@field name string
---@field type ctx.ParamType
---Whether the caller must supply it. Default false.
---@field required? boolean
---What the parameter means, for agents.
---@field description? string
---The value used when the caller leaves the parameter out.
---@field default? any
---The allowed values.
---@field enum? any[]
---JSON Schema of the elements, for type "array", e.g. `{ type = "string" }`.
---@field items? table

---`tool.parameters` as a full JSON Schema (2020-12) of an object.
---@class ctx.ObjectSchema
---@field type "object"
---@field properties? table<string, table>
---@field required? string[]
---@field [string] any

---Hints for clients about the tool's behaviour; anything left out is not claimed.
---@class ctx.ToolAnnotations
---A human-friendly name.
---@field title? string
---The tool changes nothing.
---@field read_only? boolean
---The tool may delete or overwrite things.
---@field destructive? boolean
---Calling it twice with the same parameters has no further effect.
---@field idempotent? boolean
---The tool reaches systems outside ctx.
---@field open_world? boolean

---A Lua tool: set the global `tool` to this table, or `return` it from the script.
---@class ctx.Tool
---1 to 128 letters, digits, "_", "." or "-". Default: the name in [tools.script.<name>], which it
---should match.
---@field name? string
---One or two sentences telling an agent when to call the tool.
---@field description string
---The script's own version, e.g. "1.0.0".
---@field version? string
---The list form (one `ctx.ParamSpec` per parameter) or a JSON Schema object. Default: none.
---@field parameters? ctx.ParamSpec[]|ctx.ObjectSchema
---Accept parameters the list form does not declare. Default false; ignored for a JSON Schema.
---@field additional_parameters? boolean
---@field annotations? ctx.ToolAnnotations
---JSON Schema of the result, when the tool always returns an object.
---@field output_schema? table
---Every call waits for a person's approval (as `approve = true` in the tool's section).
---@field approve? boolean
---Required: runs the tool. `params` has been validated and has its defaults filled in. Return any
---JSON-able value, an `MCP.*` result, or a table with an `error` key for a failure the script
---handled. An error raised here (or a timeout, or the memory cap) fails the call with a message
---that names the script and line.
---@field execute? fun(params: table<string, any>, context: ctx.Context): any
---Another name for `execute` (the name some tool collections use). Define one of the two: a
---script that defines both fails to load.
---@field handler? fun(params: table<string, any>, context: ctx.Context): any

---The tool this script defines. `function tool.execute(params, context) ... end` fills in
---`execute`.
---@type ctx.Tool
tool = {}

---A result built by an `MCP` helper; return it from `tool.execute` as it is. It carries a
---metatable only the host holds, so a plain table with the same fields is not a helper result.
---@class ctx.McpResult
---Which helper built it.
---@field kind "success"|"json"|"text"|"error"
---The value, for "success" and "json"; the details, for "error".
---@field data? any
---The text, for "text".
---@field text? string
---For "error".
---@field code? string
---For "error".
---@field message? string

---Helpers that say exactly what the client sees. Returning a plain value works too: it reads the
---same as `MCP.success(value)`, except that a table with a non-null `error` key is a handled
---failure (REST 200 `{"result": table}`; MCP `isError`, with the `error` value as the text).
---The full mapping is in schemas/mcp-call-result.schema.json.
MCP = {}

---A successful result: REST 200 `{"result": data}`; MCP one text block holding `data` as JSON (a
---string as is), and `structuredContent` when `data` is an object. Use it to return a table that
---has an `error` key without it counting as a failure.
---@param data any
---@return ctx.McpResult
function MCP.success(data) end

---A failed call: REST answers 500 with the error envelope (code "tool_error", `message`, and
---`data = {code = code, data = data}`); MCP marks the result `isError`, with `message` as the text.
---@param code string A short machine-readable code, e.g. "not_configured".
---@param message? string A sentence for the agent or the user. Default: the code.
---@param data? any Any JSON-able details.
---@return ctx.McpResult
function MCP.error(code, message, data) end

---A result that is shown as this text: REST 200 `{"result": text}`; MCP one text block, no
---structured content. A non-string value is converted to a string; nil is an error.
---@param text string
---@return ctx.McpResult
function MCP.text(text) end

---Same as `MCP.success(data)`.
---@param data any
---@return ctx.McpResult
function MCP.json(data) end

---MCP content blocks, given as MCP spells them: `{type = "text", text = ...}`,
---`{type = "image", data = <base64>, mimeType = "image/png"}`, `{type = "audio", data, mimeType}`,
---`{type = "resource", resource = {uri = ..., mimeType = ..., text = ... | blob = <base64>}}`.
---REST 200 `{"result": {"content": blocks}}`; MCP those blocks. A malformed block is an error
---naming it.
---@param blocks table[]
---@return ctx.McpResult
function MCP.content(blocks) end

---Reports progress of a long call to the client, when the client asked for progress (an MCP
---progressToken); otherwise it does nothing. Raises an error for a non-finite number.
---@param done number Work done so far; it should grow from call to call.
---@param total? number Total work, when known.
---@param message? string What is happening now.
function progress(done, total, message) end

-- ---------------------------------------------------------------------------------------------
-- Connectors

---One document produced by `connector.scan`.
---@class ctx.ConnectorItem
---Required: a stable id within this connector (1 to 1024 characters). Items that the next full
---scan does not return are deleted from the index.
---@field source_id string
---Required: the full text to index.
---@field body string
---Default: the source_id.
---@field title? string
---MIME type of body. Default "text/plain".
---@field content_type? string
---@field source_url? string
---@field author? string
---ISO 8601 / RFC 3339 text, or unix seconds.
---@field created_at? string|integer
---ISO 8601 / RFC 3339 text, or unix seconds.
---@field updated_at? string|integer
---Extra metadata: any JSON value, or a string holding JSON text.
---@field metadata_json? any

---A small key-value state a connector keeps from one sync to the next, per source: a cursor, the
---newest `updated_at` seen, a page token. `ctx sync` saves it in the database together with the
---sync's documents, and only when the sync succeeds: after a failed or stopped sync, the next
---one sees the state of the last good one. At most 64 KiB of JSON in all, keys of 1 to 256 bytes.
---@class ctx.ConnectorState
local ConnectorState = {}

---The value saved under `key`, or nil.
---@param key string
---@return any
function ConnectorState.get(key) end

---Saves `value` (any JSON-able value; nil removes the key) for the next sync. Raises an error when
---the state would pass 64 KiB; the state then stays as it was.
---@param key string
---@param value any
function ConnectorState.set(key, value) end

---The second argument of `connector.scan`: where the last sync of this source stopped.
---@class ctx.ConnectorContext
---When the last successful sync of this source started (RFC 3339, UTC), or nil on the first sync
---(and in `ctx connector test`). Ask the source for what changed since then, and return it as a
---`ctx.IncrementalScan`.
---@field last_sync? string
---@field state ctx.ConnectorState

---What an incremental `scan` returns: only what changed. Documents it neither returns nor names in
---`deleted` stay as they are. (A plain list of items is a full scan: the documents it does not
---return are deleted.)
---@class ctx.IncrementalScan
---New and changed items.
---@field items ctx.ConnectorItem[]
---The source ids of items deleted at the source since the last sync.
---@field deleted? string[]

---A Lua connector: set the global `connector` to this table, or `return` it from the script.
---@class ctx.Connector
---@field name? string
---@field version? string
---@field description? string
---Required: returns every item of the source. `config` holds the extra keys of the
---`[connectors.script.<name>]` section, with `${VAR}` expanded.
---@field scan? fun(config: table<string, any>, context: ctx.ConnectorContext): ctx.ConnectorItem[]|ctx.IncrementalScan

---The connector this script defines. `function connector.scan(config, context) ... end` fills in
---`scan`.
---@type ctx.Connector
connector = {}

-- ---------------------------------------------------------------------------------------------
-- Agents

---One argument the user supplies when picking an agent (MCP prompt arguments are strings).
---@class ctx.AgentArgument
---@field name string
---@field description? string
---@field required? boolean

---One opening message of a resolved prompt.
---@class ctx.PromptMessage
---@field role "user"|"assistant"
---@field content string

---What `agent.resolve` returns.
---@class ctx.ResolvedAgent
---@field system string The system prompt.
---@field messages? ctx.PromptMessage[] Opening messages, e.g. documents from the knowledge base.
---@field tools? string[] Tools to use; default: the agent's declared tools.

---A Lua agent: set the global `agent` to this table, or `return` it from the script.
---@class ctx.Agent
---@field name? string
---@field description string One line shown to users picking an agent.
---@field tools? string[] Names of registered tools the agent should use.
---@field arguments? ctx.AgentArgument[]
---Required: builds the prompt. `config` holds the extra keys of `[agents.script.<name>]`.
---@field resolve? fun(args: table<string, string>, config: table<string, any>, context: ctx.Context): ctx.ResolvedAgent

---The agent this script defines. `function agent.resolve(args, config, context) ... end` fills in `resolve`.
---@type ctx.Agent
agent = {}
