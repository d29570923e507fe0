// Activity: the tool-call log as it grows (GET /calls, polled; entries kept by seq so each shows
// once), filtered by tool, caller, outcome and time; the upstream servers from /health; and
// charts from /metrics and the log.

import { accessInfo, get, toolList } from "./api.js";
import { badge, duration, errorBox, every, h, jsonBlock, relative, replace, timeText } from "./dom.js";
import { groupedHBars, histogramQuantiles, legend, parsePrometheus, stackedBars } from "./charts.js";

const POLL_MS = 2000;
const CHART_MS = 10000;
const PAGE = 100;

export async function mount(root) {
  const filters = filterForm();
  const status = h("div");
  const list = h("ol", { class: "calls", "aria-live": "polite", "aria-label": "Tool calls, newest first" });
  const more = h("button", { type: "button", hidden: true }, "Load older calls");
  const upstreams = h("div", { class: "upstreams" });
  const charts = h("div", { class: "charts" });
  root.append(
    h("h1", {}, "Activity"),
    h("section", { class: "panel" }, h("h2", {}, "Calls"), filters.form, status, list, more),
    h("section", { class: "panel" }, h("h2", {}, "Upstream servers"), upstreams),
    h("section", { class: "panel" }, h("h2", {}, "Charts"), charts),
  );

  const entries = new Map(); // seq → call record
  let newest = -1;
  let before = null; // the next page of older calls (next_before)

  async function load({ reset = false } = {}) {
    const query = filters.query();
    if (reset) {
      entries.clear();
      list.replaceChildren();
      newest = -1;
    }
    let page;
    try {
      page = await get(`/calls?${new URLSearchParams({ ...query, limit: String(PAGE) })}`);
      replace(status);
    } catch (err) {
      replace(status, errorBox(err));
      return;
    }
    // New calls go on top, newest first; a call already shown is not shown again.
    const fresh = page.calls.filter((c) => !entries.has(c.seq)).sort((a, b) => b.seq - a.seq);
    if (reset) {
      before = page.next_before ?? null;
      more.hidden = before === null;
    }
    for (const call of fresh) entries.set(call.seq, call);
    const nodes = fresh.filter((c) => c.seq > newest).map((c) => row(c, entries, !reset));
    list.prepend(...nodes);
    const older = fresh.filter((c) => c.seq < newest).map((c) => row(c, entries, false));
    list.append(...older);
    if (fresh.length) newest = Math.max(newest, ...fresh.map((c) => c.seq));
    if (!entries.size) replace(status, h("p", { class: "muted" }, "No calls match."));
  }

  more.addEventListener("click", async () => {
    try {
      const page = await get(`/calls?${new URLSearchParams({ ...filters.query(), limit: String(PAGE), before: String(before) })}`);
      const older = page.calls.filter((c) => !entries.has(c.seq));
      for (const c of older) entries.set(c.seq, c);
      list.append(...older.map((c) => row(c, entries, false)));
      before = page.next_before ?? null;
      more.hidden = before === null;
    } catch (err) {
      replace(status, errorBox(err));
    }
  });
  filters.onChange(() => load({ reset: true }));

  const pollHealth = () => health(upstreams);
  const pollCharts = () => drawCharts(charts);
  await Promise.all([load({ reset: true }), pollHealth(), pollCharts(), filters.fillTools()]);
  const stops = [every(POLL_MS, () => load()), every(POLL_MS, pollHealth), every(CHART_MS, pollCharts)];
  return () => stops.forEach((stop) => stop());
}

const SINCE = [
  ["15m", "last 15 minutes"],
  ["1h", "last hour"],
  ["24h", "last 24 hours"],
  ["7d", "last 7 days"],
  ["", "any time"],
];

function filterForm() {
  const tool = h("input", { type: "text", name: "tool", list: "activity-tools", autocomplete: "off", placeholder: "any" });
  const tools = h("datalist", { id: "activity-tools" });
  const caller = h("input", { type: "text", name: "caller", autocomplete: "off", placeholder: "any" });
  const outcome = h("select", { name: "outcome" }, h("option", { value: "" }, "any"), h("option", { value: "false" }, "ok"), h("option", { value: "true" }, "errors"));
  const since = h("select", { name: "since" }, SINCE.map(([v, t]) => h("option", { value: v, selected: v === "24h" }, t)));
  const form = h(
    "form",
    { class: "row filters", "aria-label": "Filter calls" },
    h("div", { class: "field" }, h("label", { for: "f-tool" }, "Tool"), Object.assign(tool, { id: "f-tool" }), tools),
    h("div", { class: "field" }, h("label", { for: "f-caller" }, "Caller"), Object.assign(caller, { id: "f-caller" })),
    h("div", { class: "field" }, h("label", { for: "f-outcome" }, "Outcome"), Object.assign(outcome, { id: "f-outcome" })),
    h("div", { class: "field" }, h("label", { for: "f-since" }, "Time"), Object.assign(since, { id: "f-since" })),
    h("button", { type: "submit" }, "Filter"),
  );
  let changed = () => {};
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    changed();
  });
  for (const select of [outcome, since]) select.addEventListener("change", () => changed());
  return {
    form,
    query() {
      const q = {};
      if (tool.value.trim()) q.tool = tool.value.trim();
      if (caller.value.trim()) q.caller = caller.value.trim();
      if (outcome.value) q.errors = outcome.value;
      if (since.value) q.since = since.value;
      return q;
    },
    onChange(fn) {
      changed = fn;
    },
    async fillTools() {
      const names = await toolList().then((ts) => ts.map((t) => t.name), () => []);
      replace(tools, names.map((n) => h("option", { value: n })));
    },
  };
}

/** One call: a summary line that opens on its parameters, result and inner calls. */
function row(call, entries, isNew) {
  const ok = call.outcome === "ok";
  const details = h(
    "details",
    { class: "call" },
    h(
      "summary",
      {},
      h("span", { class: "when" }, timeText(call.at)),
      " ",
      h("code", { class: "call-tool" }, call.tool),
      " ",
      badge(call.outcome, ok ? "ok" : "bad"),
      " ",
      h("span", { class: "muted" }, `${call.caller || "unscoped"} · ${call.via} · ${duration(call.ms)}`),
      call.parent ? h("span", { class: "muted" }, " · inner call") : null,
    ),
  );
  // The body is built when opened: inner calls may have been logged after their parent.
  details.addEventListener("toggle", () => {
    if (!details.open) return;
    details.querySelector(".call-body")?.remove();
    details.append(callBody(call, entries));
  });
  return h("li", { class: isNew ? "new" : null, dataset: { seq: call.seq, tool: call.tool, outcome: call.outcome } }, details);
}

function callBody(call, entries) {
  const inner = [...entries.values()].filter((c) => c.parent === call.id).sort((a, b) => a.seq - b.seq);
  return h(
    "div",
    { class: "call-body" },
    h("dl", { class: "facts" },
      h("dt", {}, "Call"), h("dd", {}, `#${call.seq} (id ${call.id})`, call.parent ? ` · inner call of ${call.parent}` : ""),
      h("dt", {}, "Duration"), h("dd", {}, duration(call.ms)),
      h("dt", {}, "Started"), h("dd", {}, timeText(call.at), ` (${relative(call.at)})`),
    ),
    call.message ? h("div", { class: call.outcome === "ok" ? "notice" : "error" }, call.message) : null,
    h("h4", {}, "Parameters"),
    jsonBlock(call.params ?? null),
    call.result !== undefined && call.result !== null ? [h("h4", {}, "Result"), jsonBlock(call.result)] : null,
    call.truncated ? h("p", { class: "muted" }, "Cut to [log] max_value_bytes.") : null,
    inner.length
      ? [h("h4", {}, `Inner calls (${inner.length})`), h("ul", { class: "inner" }, inner.map((c) => h("li", {}, h("code", {}, c.tool), " ", badge(c.outcome, c.outcome === "ok" ? "ok" : "bad"), ` ${duration(c.ms)}`, c.message ? ` · ${c.message}` : "")))]
      : null,
  );
}

async function health(box) {
  let body;
  try {
    body = await get("/health");
  } catch (err) {
    replace(box, errorBox(err));
    return;
  }
  const ups = body.upstreams;
  if (!ups) {
    // /health leaves upstreams out for scoped tokens as well as when there are none.
    const { scoped } = await accessInfo();
    replace(box, h("p", { class: "muted" }, scoped ? "This token does not see the upstream servers: they are shown to server.auth_token only." : "No upstream MCP servers are configured."));
    return;
  }
  // Cards rather than a table: they stay readable on a narrow window.
  replace(box, h("div", { class: "upstream-list" }, ups.map(upstreamCard)));
}

function upstreamCard(u) {
  const kind = u.state === "ready" ? "ok" : u.state === "disabled" ? "" : "bad";
  return h(
    "article",
    { class: "card upstream", dataset: { upstream: u.name, state: u.state } },
    h("h3", {}, u.name, " ", badge(u.state, kind), u.attempt ? h("span", { class: "muted" }, ` attempt ${u.attempt}`) : null),
    h("dl", { class: "facts" },
      h("dt", {}, "Transport"), h("dd", {}, u.transport, u.pid ? ` · pid ${u.pid}` : ""),
      h("dt", {}, "Tools"), h("dd", {}, String(u.tools)),
      h("dt", {}, "Calls"), h("dd", {}, String(u.calls)),
      h("dt", {}, "Latency p50"), h("dd", {}, u.latency_p50_ms === undefined ? "–" : duration(u.latency_p50_ms)),
      h("dt", {}, "Restarts"), h("dd", {}, String(u.restarts)),
    ),
    u.last_error ? h("p", { class: "last-error" }, u.last_error) : null,
  );
}

const CALLS = [
  { name: "ok", class: "s-ok" },
  { name: "errors", class: "s-bad" },
];
const LATENCY = [
  { name: "p50", class: "s-p50" },
  { name: "p90", class: "s-p90" },
  { name: "p99", class: "s-p99" },
];

async function drawCharts(box) {
  const [log, metrics] = await Promise.allSettled([get("/calls?since=30m&limit=1000"), get("/metrics")]);
  const parts = [];
  // Drawn at the box's own width, so labels keep their size on a narrow window.
  const width = Math.max(280, Math.min(720, box.clientWidth || 600));
  parts.push(h("h3", {}, "Calls per minute, last 30 minutes"));
  if (log.status === "fulfilled") {
    parts.push(perMinute(log.value.calls, width), legend(CALLS));
  } else {
    parts.push(errorBox(log.reason));
  }
  if (metrics.status === "fulfilled") {
    const samples = parsePrometheus(metrics.value);
    parts.push(h("h3", {}, "Calls per tool since the server started"), byTool(samples, width), legend(CALLS));
    parts.push(h("h3", {}, "Latency per tool (from the histogram buckets)"), latency(samples, width), legend(LATENCY));
  } else {
    const err = metrics.reason;
    parts.push(h("h3", {}, "Metrics"), err.status === 403 ? h("p", { class: "notice" }, `Metrics cover every tool, so this token cannot read them: ${err.message}`) : errorBox(err));
  }
  replace(box, parts);
}

function perMinute(calls, width) {
  const now = Date.now();
  const start = Math.floor(now / 60000) - 29;
  const points = Array.from({ length: 30 }, (_, i) => {
    const d = new Date((start + i) * 60000);
    return { label: `${String(d.getHours()).padStart(2, "0")}:${String(d.getMinutes()).padStart(2, "0")}`, values: [0, 0] };
  });
  for (const c of calls) {
    const i = Math.floor(new Date(c.at).getTime() / 60000) - start;
    if (i >= 0 && i < points.length) points[i].values[c.outcome === "ok" ? 0 : 1] += 1;
  }
  return stackedBars(points, CALLS, { title: "Calls and errors per minute", width, labelEvery: width < 500 ? 10 : 5 });
}

function byTool(samples, width) {
  const per = new Map();
  for (const s of samples) {
    if (s.name !== "ctx_tool_calls_total") continue;
    const row = per.get(s.labels.tool) || [0, 0];
    row[s.labels.outcome === "ok" ? 0 : 1] += s.value;
    per.set(s.labels.tool, row);
  }
  const rows = [...per].sort((a, b) => b[1][0] + b[1][1] - a[1][0] - a[1][1]).slice(0, 12).map(([label, values]) => ({ label, values }));
  if (!rows.length) return h("p", { class: "muted" }, "No calls yet.");
  return groupedHBars(rows, CALLS, { title: "Calls per tool: ok and errors", width });
}

function latency(samples, width) {
  const rows = histogramQuantiles(samples, "ctx_tool_call_duration_seconds", "tool")
    .slice(0, 12)
    .map((t) => ({ label: t.key, values: [t.quantiles[0.5], t.quantiles[0.9], t.quantiles[0.99]].map((v) => v * 1000) }));
  if (!rows.length) return h("p", { class: "muted" }, "No calls yet.");
  return groupedHBars(rows, LATENCY, { title: "Latency percentiles per tool", width, format: (ms) => duration(ms) });
}
