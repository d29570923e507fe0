// The REST client of the console: the same API and token as any other client. The token lives
// in this tab's sessionStorage (the login page puts it there); the cookie only serves the
// console's files, so every API call carries the token itself.

const TOKEN_KEY = "ctx-token";
const APPROVER_KEY = "ctx-approver";

/** The built-ins whose routes answer with their own body instead of {"result": …}. */
const BARE = new Set(["search", "get", "sources"]);

/** A failed request, worded as the server worded it (`error.message`, `error.details`). */
export class ApiError extends Error {
  constructor(status, body, fallback) {
    const error = body && typeof body === "object" && body.error && typeof body.error === "object" ? body.error : null;
    super((error && error.message) || fallback || `the server answered ${status}`);
    this.status = status;
    this.code = error ? error.code : null;
    this.details = error && Array.isArray(error.details) ? error.details : [];
    this.data = error ? error.data : undefined;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function approverToken() {
  return sessionStorage.getItem(APPROVER_KEY) || "";
}

export function setApproverToken(value) {
  if (value) sessionStorage.setItem(APPROVER_KEY, value);
  else sessionStorage.removeItem(APPROVER_KEY);
}

/** Logs out: the cookie goes (server side), the tokens go (this tab), and so does the page. */
export async function logout() {
  try {
    await fetch("/console/logout", { method: "POST" });
  } finally {
    sessionStorage.clear();
    location.replace("/console/login");
  }
}

let leaving = false;

/**
 * A 401 means the server wants a token this tab does not have (a new tab opened with the cookie
 * only, or a token that was changed): the login page gets one.
 */
function toLogin() {
  if (leaving) return;
  leaving = true;
  sessionStorage.removeItem(TOKEN_KEY);
  location.assign("/console/login");
}

/**
 * One request. Resolves to {status, body, headers} for 2xx answers (body: parsed JSON, or text
 * when the answer is not JSON); throws an ApiError otherwise.
 */
export async function request(method, path, { body, headers = {}, signal } = {}) {
  const all = { Accept: "application/json", ...headers };
  const bearer = token();
  if (bearer) all.Authorization = `Bearer ${bearer}`;
  let init = { method, headers: all, signal };
  if (body !== undefined) {
    all["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let answer;
  try {
    answer = await fetch(path, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, null, `ctx did not answer (${err.message})`);
  }
  const type = answer.headers.get("content-type") || "";
  const parsed = type.includes("json") ? await answer.json().catch(() => null) : await answer.text();
  if (answer.status === 401) toLogin();
  if (!answer.ok) throw new ApiError(answer.status, parsed);
  return { status: answer.status, body: parsed, headers: answer.headers };
}

export const get = async (path, options) => (await request("GET", path, options)).body;
export const post = async (path, body, options) => (await request("POST", path, { ...options, body })).body;

/**
 * Calls a tool: POST /tools/{name}. Resolves to {kind: "result", result, trace} or, when the
 * call waits for a person, {kind: "approval", approval}. `approval` is the token of an earlier
 * 202 (header Ctx-Approval): sent again, the call runs once it is approved.
 */
export async function callTool(name, params, { approval, signal } = {}) {
  const headers = approval ? { "Ctx-Approval": approval } : {};
  const answer = await request("POST", `/tools/${encodeURIComponent(name)}`, { body: params, headers, signal });
  if (answer.status === 202) return { kind: "approval", approval: answer.body };
  if (BARE.has(name)) return { kind: "result", result: answer.body };
  return { kind: "result", result: answer.body.result, trace: answer.body.trace };
}

/**
 * Sends a call that answered 202 again every `intervalMs` with its approval token until it runs
 * (resolves like callTool's result) or is refused (throws the 403 approval_refused ApiError).
 * `onWait(approval)` hears each 202.
 */
export async function waitForApproval(name, params, approval, { intervalMs = 1000, onWait, signal } = {}) {
  for (;;) {
    await sleep(intervalMs, signal);
    const answer = await callTool(name, params, { approval: approval.token, signal });
    if (answer.kind === "result") return answer;
    if (onWait) onWait(answer.approval);
  }
}

export function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    if (signal) {
      signal.addEventListener("abort", () => {
        clearTimeout(timer);
        reject(new DOMException("stopped", "AbortError"));
      });
    }
  });
}

/**
 * What this token may see, found out once: a scoped token gets 403 on /approvals and /metrics.
 * Resolves to {scoped: boolean, message: the server's words for the 403}.
 */
let access = null;
export function accessInfo() {
  if (!access) {
    access = get("/approvals").then(
      () => ({ scoped: false }),
      (err) => (err.status === 403 ? { scoped: true, message: err.message } : { scoped: false }),
    );
  }
  return access;
}

/** GET /tools/list once per page load (every view needs it: names, kinds, schemas). */
let tools = null;
export function toolList({ fresh = false } = {}) {
  if (!tools || fresh) {
    tools = get("/tools/list").then((body) => body.tools);
    tools.catch(() => (tools = null));
  }
  return tools;
}
