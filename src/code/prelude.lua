-- Code mode's script-facing objects: tool functions, pending calls, await_all and result().
-- Written in Lua so that a failed call is raised as the error table it is (a Rust function
-- can only raise a string), where pcall can catch it with its fields.
local start, wait, resolve, groups, here = ...
local setmetatable, rawset, error, select, type, tostring = setmetatable, rawset, error, select, type, tostring

-- A pending call's slot and name, out of the script's reach.
local ids = setmetatable({}, { __mode = "k" })
local paths = setmetatable({}, { __mode = "k" })
-- What each awaited call gave: ctx hands a result over once and lets go of its copy.
local settled = setmetatable({}, { __mode = "k" })

local function settle(p)
  local s = settled[p]
  if s == nil then
    local ok, value = wait(ids[p])
    s = { ok, value }
    settled[p] = s
  end
  return s[1], s[2]
end

local function await(p)
  if ids[p] == nil then
    error("await: expected a pending tool call (what a tool function returns), got " .. type(p), 2)
  end
  local ok, value = settle(p)
  if ok then
    return value
  end
  error(value, 0)
end

-- Its __name lets ctx tell a pending call sent as a value from an empty table.
local Pending = { __metatable = false, __name = "pending call" }
-- `p.await()` (a dot) calls await with no pending call at all: say so, at the line read while
-- the script still runs its own code (in `return p.await()`, a tail call, the call itself
-- leaves no script line behind).
Pending.__index = function(p, key)
  if key == "await" then
    local line = here()
    return function(self)
      if ids[self] == nil then
        local at = line and ("script:" .. line .. ": ") or ""
        error(at .. ".await() on a pending call of " .. paths[p] .. " passes it no call to await: write :await(), "
          .. "with a colon, as in local r = " .. paths[p] .. "({...}):await()", 0)
      end
      return await(self)
    end
  end
  error("this is a pending call of " .. paths[p] .. ", not its result: add :await(), as in local r = "
    .. paths[p] .. "({...}):await()", 2)
end
Pending.__newindex = function()
  error("a pending call is read-only; add :await() to get its result", 2)
end
Pending.__tostring = function(p)
  return "pending call of " .. paths[p]
end

local function tool(group, name, path)
  return function(args, extra)
    if extra ~= nil then
      error(path .. ": pass the arguments as one table, as in " .. path .. "({key = value})", 2)
    end
    local ok, id = start(group, name, path, args)
    if not ok then
      error(id, 2)
    end
    local p = setmetatable({}, Pending)
    ids[p] = id
    paths[p] = path
    return p
  end
end

local function group_table(group)
  return setmetatable({}, {
    __metatable = false,
    __index = function(t, key)
      local name, path = resolve(group, key)
      if name == nil then
        error(path, 2)
      end
      local f = tool(group, name, path)
      rawset(t, key, f)
      return f
    end,
  })
end

local mcp = setmetatable({}, {
  __metatable = false,
  __index = function(t, key)
    local group, message = groups(key)
    if group == nil then
      error(message, 2)
    end
    local g = group_table(group)
    rawset(t, key, g)
    return g
  end,
})

local function await_all(...)
  local list = ...
  if select("#", ...) ~= 1 or ids[list] ~= nil then
    list = { ... }
  end
  if type(list) ~= "table" then
    error("await_all: expected a list of pending calls, got " .. type(list), 2)
  end
  local out, failed = {}, nil
  -- Every call is waited for before a failure is raised: they all run at once anyway, and the
  -- trace then has every outcome.
  for i = 1, #list do
    if ids[list[i]] == nil then
      error("await_all: item " .. i .. " is not a pending tool call", 2)
    end
    local ok, value = settle(list[i])
    if ok then
      out[i] = value
    elseif failed == nil then
      failed = value
    end
  end
  if failed ~= nil then
    error(failed, 0)
  end
  return out
end

local has, captured = false, nil
local function result(...)
  if has then
    error("result() was already called; call it once, with the whole result", 2)
  end
  if select("#", ...) == 0 then
    error("result() needs a value, as in result({count = 3})", 2)
  end
  has, captured = true, (...)
end
local function outcome()
  return has, captured
end

return group_table, mcp, await_all, result, outcome
