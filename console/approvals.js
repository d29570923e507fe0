// Approvals: calls waiting for a person (GET /approvals?all=true, polled so a new one shows up
// by itself), approve or deny with a reason, and the decided ones. Deciding needs the approver
// token ([approval] approver_token, header Ctx-Approver) besides the unscoped bearer token.

import { accessInfo, approverToken, get, post, setApproverToken } from "./api.js";
import { badge, errorBox, every, h, jsonBlock, relative, replace, timeText } from "./dom.js";

const POLL_MS = 2000;

export async function mount(root) {
  root.append(h("h1", {}, "Approvals"));
  const info = await accessInfo();
  if (info.scoped) {
    root.append(h("div", { class: "notice" }, h("p", {}, "This token is scoped to some tools, so it cannot see or decide approvals: log in with server.auth_token."), h("p", { class: "muted" }, info.message)));
    return;
  }

  const pending = h("div", { class: "pending", "aria-live": "polite" });
  const history = h("div", { class: "history" });
  const status = h("div");
  root.append(approverForm(), status, h("h2", {}, "Waiting"), pending, h("h2", {}, "Decided"), history);

  const problems = new Map(); // approval id → the error of the last decision tried on it
  const cards = new Map(); // approval id → its card (kept across polls so a typed reason stays)
  let known = "";

  async function refresh() {
    let approvals;
    try {
      approvals = (await get("/approvals?all=true")).approvals;
      replace(status);
    } catch (err) {
      replace(status, errorBox(err));
      return;
    }
    const open = approvals.filter((a) => a.state === "pending");
    const done = approvals.filter((a) => a.state !== "pending");
    // Rebuild only what changed, so focus and a half-typed reason survive a poll.
    const key = JSON.stringify(approvals.map((a) => [a.id, a.state]));
    if (key === known) return;
    known = key;
    for (const id of [...cards.keys()]) if (!open.some((a) => a.id === id)) cards.delete(id);
    for (const a of open) if (!cards.has(a.id)) cards.set(a.id, pendingCard(a, decide));
    replace(pending, open.length ? open.map((a) => cards.get(a.id)) : h("p", { class: "muted" }, "Nothing waits for approval."));
    replace(history, done.length ? h("ul", { class: "decided" }, done.map(decidedItem)) : h("p", { class: "muted" }, "Nothing decided yet."));
  }

  async function decide(approval, verdict, reason, where) {
    problems.delete(approval.id);
    try {
      const headers = approverToken() ? { "Ctx-Approver": approverToken() } : {};
      const body = verdict === "deny" && reason ? { reason } : {};
      await post(`/approvals/${encodeURIComponent(approval.id)}/${verdict}`, body, { headers });
      replace(where);
    } catch (err) {
      replace(where, errorBox(err));
      return;
    }
    known = "";
    await refresh();
  }

  await refresh();
  return every(POLL_MS, refresh);
}

/** The approver token, kept in this tab's sessionStorage. */
function approverForm() {
  const input = h("input", { type: "password", id: "approver-token", autocomplete: "off", value: approverToken() });
  const saved = h("span", { class: "muted", role: "status" }, approverToken() ? "set for this tab" : "not set");
  const form = h(
    "form",
    { class: "row approver" },
    h("div", { class: "field" }, h("label", { for: "approver-token" }, "Approver token"), input, h("small", { class: "help" }, "[approval] approver_token of ctx.toml: sent as Ctx-Approver when you approve or deny.")),
    h("button", { type: "submit" }, "Use"),
    saved,
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    setApproverToken(input.value.trim());
    saved.textContent = input.value.trim() ? "set for this tab" : "not set";
  });
  return form;
}

function pendingCard(a, decide) {
  const where = h("div");
  const reason = h("input", { type: "text", name: "reason", placeholder: "why (optional)", "aria-label": `Reason to deny ${a.id}` });
  const approve = h("button", { type: "button", class: "primary", "aria-label": `Approve ${a.id}`, onclick: () => decide(a, "approve", null, where) }, "Approve");
  const deny = h(
    "form",
    { class: "row deny", onsubmit: (event) => (event.preventDefault(), decide(a, "deny", reason.value.trim(), where)) },
    reason,
    h("button", { type: "submit", class: "danger", "aria-label": `Deny ${a.id}` }, "Deny"),
  );
  return h(
    "article",
    { class: "card approval", dataset: { approval: a.id, tool: a.tool } },
    h("h3", {}, h("code", {}, a.tool), " ", badge("pending", "warn")),
    h("dl", { class: "facts" },
      h("dt", {}, "Id"), h("dd", {}, a.id),
      h("dt", {}, "Caller"), h("dd", { class: "caller" }, a.caller || "unscoped (server.auth_token)", ` via ${a.via}`),
      h("dt", {}, "Asked"), h("dd", {}, timeText(a.created_at)),
      h("dt", {}, "Expires"), h("dd", {}, timeText(a.expires_at), ` (${relative(a.expires_at)})`),
    ),
    h("h4", {}, "Parameters"),
    jsonBlock(a.params, `Parameters of ${a.id}`),
    h("div", { class: "row" }, approve, deny),
    where,
  );
}

function decidedItem(a) {
  const kind = a.state === "approved" || a.state === "used" ? "ok" : "bad";
  return h(
    "li",
    { class: "decided-item", dataset: { approval: a.id, state: a.state } },
    badge(a.state, kind), " ", h("code", {}, a.tool), ` ${a.id} · `, a.caller || "unscoped",
    a.decided_at ? [" · decided ", timeText(a.decided_at)] : null,
    a.decided_by ? ` by ${a.decided_by}` : null,
    a.reason ? h("span", { class: "reason" }, ` · reason: ${a.reason}`) : null,
    h("details", {}, h("summary", {}, "Parameters"), jsonBlock(a.params)),
  );
}
