// Chat: a conversation with the model of [chat] (POST /chat). The server hands the model the
// tools this token may use; the browser runs the loop: each tool call the model asks for runs
// through POST /tools/{name} with this tab's token (approval waits included), its result goes
// back as a "tool" message, and the model is asked again until it answers without tool calls.

import { ApiError, callTool, get, post, waitForApproval } from "./api.js";
import { errorBox, field, h, jsonBlock, replace } from "./dom.js";
import { failureView, resultView } from "./result.js";
import { approvalCard } from "./tools.js";

// The conversation outlives a visit to another page: a call waiting for approval goes on
// waiting while the user approves it under Approvals, and the loop continues.
const chat = {
  messages: [],
  log: h("ol", { class: "conversation", "aria-live": "polite", "aria-label": "Conversation" }),
  status: h("p", { class: "chat-status muted", role: "status" }),
  running: false,
  listeners: new Set(),
};

export async function mount(root) {
  root.append(h("h1", {}, "Chat"));
  let info;
  try {
    info = await get("/chat");
  } catch (err) {
    root.append(err instanceof ApiError && err.status === 404 ? h("p", { class: "notice" }, "This server has no chat endpoint (a ctx older than the console's chat).") : errorBox(err));
    return;
  }
  if (!info.enabled) {
    root.append(
      h("div", { class: "notice chat-disabled" },
        h("p", {}, h("strong", {}, "Chat is off on this server."), " To turn it on, add a [chat] section to ctx.toml:"),
        h("pre", { class: "text" }, info.hint || "[chat]\nprovider = \"openai\"\nmodel = \"…\"\nurl = \"http://127.0.0.1:11434/v1\""),
      ),
    );
    return;
  }

  const input = h("textarea", { id: "chat-input", rows: 3, placeholder: "Ask something. Enter sends, Shift+Enter is a new line." });
  const send = h("button", { type: "submit", class: "primary" }, "Send");
  const reset = h("button", { type: "button", onclick: () => newConversation() }, "New conversation");
  const composer = h("form", { class: "composer" }, h("label", { for: "chat-input", class: "visually-hidden" }, "Message"), input, h("div", { class: "row" }, send, reset));
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      composer.requestSubmit();
    }
  });
  composer.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text || chat.running) return;
    input.value = "";
    say({ role: "user", content: text });
    converse();
  });
  const sync = () => {
    send.disabled = chat.running;
    reset.disabled = chat.running;
  };
  chat.listeners.add(sync);
  sync();

  root.append(
    h("p", { class: "muted model" }, `Model: ${info.model} (${info.provider}), offered ${info.tools ?? "the"} tools this token may use. Each call it asks for shows here and runs from this page, with this token.`),
    await agentStarter(),
    chat.log,
    chat.status,
    composer,
  );
  if (!chat.messages.length) input.focus();
  return () => chat.listeners.delete(sync);
}

function setRunning(running, text = "") {
  chat.running = running;
  chat.status.textContent = text;
  for (const fn of chat.listeners) fn();
}

function newConversation() {
  chat.messages = [];
  chat.log.replaceChildren();
  setRunning(false);
}

/** Adds a message to the conversation and shows it. */
function say(message) {
  chat.messages.push(message);
  if (message.role !== "tool") chat.log.append(bubble(message));
}

function bubble(message) {
  const who = { system: "System", user: "You", assistant: "Model", tool: "Tool" }[message.role] || message.role;
  if (message.role === "system") {
    return h("li", { class: "msg system", dataset: { role: "system" } }, h("details", {}, h("summary", {}, "System prompt"), h("pre", { class: "text" }, message.content || "")));
  }
  const calls = message.tool_calls || [];
  return h(
    "li",
    { class: `msg ${message.role}`, dataset: { role: message.role } },
    h("div", { class: "who" }, who),
    message.content ? h("div", { class: "content" }, message.content) : null,
    calls.length ? h("div", { class: "muted" }, `asks to call ${calls.map((c) => c.name).join(", ")}`) : null,
  );
}

/** Asks the model, runs the tool calls it asks for, and asks again, until it just answers. */
async function converse() {
  if (chat.running) return;
  setRunning(true, "The model is thinking…");
  try {
    for (;;) {
      let answer;
      try {
        answer = await post("/chat", { messages: chat.messages });
      } catch (err) {
        chat.log.append(h("li", { class: "msg failed" }, errorBox(err, "The model did not answer:"), h("button", { type: "button", onclick: (e) => (e.target.closest("li").remove(), converse()) }, "Try again")));
        return;
      }
      const message = answer.message;
      say(message);
      const calls = message.tool_calls || [];
      if (!calls.length) return;
      for (const call of calls) {
        const content = await runCall(call);
        say({ role: "tool", tool_call_id: call.id, content });
      }
      setRunning(true, "The model is thinking…");
    }
  } finally {
    setRunning(false);
  }
}

/** One tool call the model asked for: shown, run with this tab's token, answered as text. */
async function runCall(call) {
  const args = typeof call.arguments === "string" ? parseArguments(call.arguments) : call.arguments || {};
  const outcome = h("div", { class: "outcome" }, h("p", { class: "muted" }, "Running…"));
  chat.log.append(
    h("li", { class: "msg tool-call", dataset: { tool: call.name, call: call.id } },
      h("div", { class: "who" }, "Tool call ", h("code", {}, call.name)),
      jsonBlock(args, `Arguments of ${call.name}`),
      outcome,
    ),
  );
  setRunning(true, `Running ${call.name}…`);
  try {
    let answer = await callTool(call.name, args);
    if (answer.kind === "approval") {
      setRunning(true, `Waiting for approval ${answer.approval.id}…`);
      replace(outcome, approvalCard(answer.approval));
      answer = await waitForApproval(call.name, args, answer.approval, { onWait: (a) => replace(outcome, approvalCard(a)) });
    }
    replace(outcome, h("div", { class: "who" }, "Result"), resultView(answer.result, answer.trace));
    return typeof answer.result === "string" ? answer.result : JSON.stringify(answer.result);
  } catch (err) {
    replace(outcome, failureView(err));
    // The model reads the failure as the server worded it, and can correct itself.
    const error = { code: err.code || "error", message: err.message };
    if (err.details && err.details.length) error.details = err.details;
    return JSON.stringify({ error });
  }
}

function parseArguments(text) {
  try {
    return JSON.parse(text);
  } catch {
    return {};
  }
}

/** A conversation can start from an agent: its resolved prompt seeds the messages. */
async function agentStarter() {
  let agents = [];
  try {
    agents = (await get("/agents/list")).agents;
  } catch {
    return null;
  }
  if (!agents.length) return null;
  const select = h("select", { id: "agent-select" }, agents.map((a) => h("option", { value: a.name }, a.name)));
  const args = h("div", { class: "row" });
  const problem = h("div");
  const description = h("p", { class: "muted" });
  const showArgs = () => {
    const agent = agents.find((a) => a.name === select.value);
    description.textContent = agent.description;
    replace(args, agent.arguments.map((arg) => field(arg.name + (arg.required ? " *" : ""), h("input", { type: "text", name: arg.name, dataset: { arg: arg.name }, "aria-required": arg.required ? "true" : null }), arg.description)));
  };
  select.addEventListener("change", showArgs);
  showArgs();
  const form = h(
    "form",
    { class: "agent-start" },
    h("div", { class: "row" }, field("Start from an agent", select), h("button", { type: "submit" }, "Start conversation")),
    description,
    args,
    problem,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (chat.running) return;
    const values = {};
    for (const input of args.querySelectorAll("input")) if (input.value.trim()) values[input.dataset.arg] = input.value.trim();
    replace(problem);
    let prompt;
    try {
      prompt = await post(`/agents/${encodeURIComponent(select.value)}/prompt`, values);
    } catch (err) {
      replace(problem, errorBox(err));
      return;
    }
    newConversation();
    say({ role: "system", content: prompt.system });
    for (const m of prompt.messages) say({ role: m.role, content: m.content });
    // Opening messages that end with the user's turn are a question: the model answers it.
    if (prompt.messages.length && prompt.messages[prompt.messages.length - 1].role === "user") converse();
    else document.getElementById("chat-input")?.focus();
  });
  return h("details", { class: "panel agents", open: !chat.messages.length }, h("summary", {}, "Agents"), form);
}
