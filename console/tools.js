// Tools: every tool this token may call (GET /tools/list), a form generated from the chosen
// tool's JSON Schema, and the call (POST /tools/{name}) with its result, its trace for code
// mode, its validation errors at the fields, and its wait for approval.

import { callTool, toolList, waitForApproval } from "./api.js";
import { badge, errorBox, h, jsonBlock, relative, replace, timeText } from "./dom.js";
import { schemaForm } from "./form.js";
import { failureView, resultView } from "./result.js";

// One panel per tool, kept across visits: a call waiting for approval goes on waiting (and shows
// its result) while the user approves it elsewhere in the console.
const panels = new Map();

const KINDS = [
  ["builtin", "Built-in"],
  ["lua", "Lua"],
  ["scripted", "Scripted (code mode)"],
  ["upstream", "Upstream (MCP)"],
];

/** Which kind of tool: built-in, Lua, scripted (takes a script), or upstream (server__tool). */
export function kindOf(tool) {
  if (tool.builtin) return "builtin";
  if (tool.name.includes("__")) return "upstream";
  if (takesScript(tool)) return "scripted";
  return "lua";
}

function takesScript(tool) {
  const props = (tool.parameters && tool.parameters.properties) || {};
  return (tool.name === "execute" || !tool.builtin) && props.script && props.script.type === "string";
}

export async function mount(root, [selected]) {
  root.append(h("h1", {}, "Tools"));
  let tools;
  try {
    tools = await toolList({ fresh: !selected });
  } catch (err) {
    root.append(errorBox(err));
    return;
  }
  const detail = h("div", { class: "tool-detail" });
  const filter = h("input", { type: "search", placeholder: "Filter tools", "aria-label": "Filter tools", autocomplete: "off" });
  const list = h("nav", { class: "tool-list", "aria-label": "Tools" });
  // On a narrow window the list folds away once a tool is chosen, so the tool comes first.
  const wide = window.matchMedia("(min-width: 701px)").matches;
  const side = h("details", { class: "side", open: !selected || wide }, h("summary", {}, `All tools (${tools.length})`), filter, list);
  root.append(h("div", { class: "split" }, side, detail));

  const renderList = () => {
    const words = filter.value.trim().toLowerCase();
    const shown = tools.filter((t) => !words || t.name.toLowerCase().includes(words) || (t.description || "").toLowerCase().includes(words));
    replace(
      list,
      KINDS.map(([kind, title]) => {
        const mine = shown.filter((t) => kindOf(t) === kind);
        if (!mine.length) return null;
        return [h("h2", { class: "group" }, title), h("ul", {}, mine.map((t) => h("li", {}, h("a", { href: `#/tools/${encodeURIComponent(t.name)}`, "aria-current": t.name === selected ? "page" : null, dataset: { tool: t.name } }, t.name))))];
      }),
      shown.length ? null : h("p", { class: "muted" }, "No tool matches."),
    );
  };
  filter.addEventListener("input", renderList);
  renderList();

  const tool = tools.find((t) => t.name === selected);
  if (!selected) {
    detail.append(h("p", { class: "muted" }, `${tools.length} tools. Choose one to see what it does and to call it.`));
  } else if (!tool) {
    detail.append(errorBox(new Error(`This token has no tool named "${selected}".`)));
  } else {
    if (!panels.has(tool.name)) panels.set(tool.name, panel(tool));
    detail.append(panels.get(tool.name));
    const heading = detail.querySelector("h2");
    heading.focus();
  }
}

function annotations(tool) {
  const a = tool.annotations || {};
  return [
    a.read_only ? badge("read-only", "ok") : null,
    a.read_only === false ? badge("writes", "warn") : null,
    a.destructive ? badge("destructive", "bad") : null,
    a.idempotent ? badge("idempotent") : null,
    a.open_world ? badge("open world") : null,
  ].filter(Boolean);
}

function panel(tool) {
  const kind = kindOf(tool);
  const output = h("div", { class: "output", "aria-live": "polite" });
  const description = tool.description || "";
  // Long descriptions (code mode's catalog) fold after their first paragraph.
  const [first, ...rest] = description.split(/\n\s*\n/);
  const api = schemaForm(tool.parameters, {
    submitLabel: kind === "scripted" || tool.name === "execute" ? "Run script" : "Call",
    onSubmit: (params) => run(tool, params, output, api),
    overrides: takesScript(tool) ? { "/script": scriptEditor } : {},
  });
  return h(
    "article",
    { class: "tool", dataset: { tool: tool.name } },
    h("h2", { tabindex: "-1" }, tool.name),
    h("p", { class: "badges" }, badge(KINDS.find(([k]) => k === kind)[1], "kind"), " ", tool.version ? badge(`v${tool.version}`) : null, " ", annotations(tool).flatMap((b) => [b, " "])),
    tool.annotations && tool.annotations.title ? h("p", { class: "muted" }, tool.annotations.title) : null,
    h("p", { class: "description" }, first),
    rest.length ? h("details", {}, h("summary", {}, "More"), h("pre", { class: "text" }, rest.join("\n\n"))) : null,
    tool.output_schema ? h("details", { class: "output-schema" }, h("summary", {}, "What it returns (output schema)"), jsonBlock(tool.output_schema)) : null,
    api.form,
    output,
  );
}

/** A monospace script editor where Tab indents (Escape, then Tab, leaves it). */
export function scriptEditor() {
  const control = h("textarea", { class: "code", rows: 14, wrap: "off", spellcheck: "false", autocapitalize: "off", placeholder: 'local hits = ctx.search({query = "deploy", limit = 3}):await()\nreturn hits' });
  let escaped = false;
  control.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      escaped = true;
      return;
    }
    if (event.key === "Tab" && !escaped && !event.shiftKey && !event.ctrlKey && !event.altKey) {
      event.preventDefault();
      const { selectionStart: start, selectionEnd: end, value } = control;
      control.value = value.slice(0, start) + "  " + value.slice(end);
      control.selectionStart = control.selectionEnd = start + 2;
      return;
    }
    escaped = false;
  });
  control.setAttribute("aria-description", "Tab inserts two spaces; press Escape then Tab to move on; Ctrl+Enter runs the script.");
  return { control, read: () => (control.value.trim() === "" ? {} : { value: control.value }) };
}

async function run(tool, params, output, api) {
  replace(output, h("p", { class: "muted", role: "status" }, `Calling ${tool.name}…`));
  api.button.disabled = true;
  try {
    let answer = await callTool(tool.name, params);
    if (answer.kind === "approval") {
      const card = h("div");
      const show = (approval) => replace(card, approvalCard(approval));
      show(answer.approval);
      replace(output, card);
      api.button.disabled = false;
      answer = await waitForApproval(tool.name, params, answer.approval, { onWait: show });
    }
    replace(output, h("h3", {}, "Result"), resultView(answer.result, answer.trace));
  } catch (err) {
    if (err.details && err.details.length) api.showErrors(err.details);
    replace(output, failureView(err));
  } finally {
    api.button.disabled = false;
  }
}

/** A call that waits for a person: what would run, and how long the approval lasts. */
export function approvalCard(approval) {
  return h(
    "div",
    { class: "approval-wait", role: "status", dataset: { approval: approval.id } },
    h("strong", {}, `Waiting for approval ${approval.id}`),
    h("p", {}, `${approval.tool} runs once a person approves it under `, h("a", { href: "#/approvals" }, "Approvals"), ` (or ctx approvals approve ${approval.id}). Expires `, timeText(approval.expires_at), ` (${relative(approval.expires_at)}).`),
    approval.message ? h("details", {}, h("summary", {}, "The server's message"), h("p", {}, approval.message)) : null,
  );
}
