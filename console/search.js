// Search: the knowledge base through POST /tools/search, and one document with its chunks
// through POST /tools/get.

import { get, post, toolList } from "./api.js";
import { badge, errorBox, field, h, jsonBlock, replace, timeText } from "./dom.js";

// The last search survives a visit to a document, so "back" finds the results again.
const state = { request: null, response: null, error: null };

export async function mount(root) {
  const form = h("form", { class: "search-form", role: "search", "aria-label": "Search the knowledge base" });
  const results = h("div", { class: "results", "aria-live": "polite" });
  root.append(h("h1", {}, "Search"), form, results);

  const [sources, fields] = await Promise.all([
    get("/tools/sources").then((b) => b.sources, () => []),
    toolList().then(searchFields, () => new Set(["since"])),
  ]);
  buildForm(form, sources, fields, (request) => run(request, results));
  if (state.response || state.error) show(results);
}

/** The properties the server's search takes: the date filters shown are the ones it has. */
function searchFields(tools) {
  const search = tools.find((t) => t.name === "search");
  return new Set(Object.keys((search && search.parameters && search.parameters.properties) || {}));
}

function buildForm(form, sources, fields, submit) {
  const last = state.request || {};
  const query = h("input", { type: "search", name: "query", required: true, value: last.query || "", placeholder: "rollback a deploy", autocomplete: "off" });
  const mode = h("select", { name: "mode" }, ["keyword", "semantic", "hybrid"].map((m) => h("option", { value: m, selected: (last.mode || "keyword") === m }, m)));
  const source = h(
    "select",
    { name: "source" },
    h("option", { value: "" }, "all sources"),
    sources.map((s) => h("option", { value: s.name, selected: last.source === s.name }, s.name)),
  );
  const dates = ["since", "until"].filter((key) => fields.has(key)).map((key) => field(key === "since" ? "Updated since" : "Updated until", h("input", { type: "date", name: key, value: last[key] || "" })));
  const limit = h("input", { type: "number", name: "limit", min: 1, max: 100, value: last.limit || "", placeholder: "12", inputmode: "numeric" });
  replace(
    form,
    h("div", { class: "row" }, field("Query", query), h("button", { type: "submit", class: "primary" }, "Search")),
    h("div", { class: "row filters" }, field("Mode", mode), field("Source", source), dates, field("Results", limit)),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const request = { query: String(data.get("query") || "").trim() };
    for (const key of ["mode", "source", "since", "until"]) {
      const value = data.get(key);
      if (value) request[key] = String(value);
    }
    if (data.get("limit")) request.limit = Number(data.get("limit"));
    submit(request);
  });
  if (!state.request) query.focus();
}

async function run(request, results) {
  state.request = request;
  replace(results, h("p", { class: "muted" }, "Searching…"));
  try {
    state.response = await post("/tools/search", request);
    state.error = null;
  } catch (err) {
    state.response = null;
    state.error = err;
  }
  show(results);
}

function show(results) {
  if (state.error) return replace(results, errorBox(state.error));
  const { results: hits, mode } = state.response;
  const asked = state.request.mode || "keyword";
  replace(
    results,
    h("p", { class: "muted", id: "result-count" }, `${hits.length} result${hits.length === 1 ? "" : "s"}, ranked by ${mode}`, mode !== asked ? ` (asked for ${asked}: the server has no embedding provider)` : ""),
    h("ol", { class: "hits" }, hits.map(hit)),
  );
}

function hit(result) {
  const where = result.source_url
    ? h("a", { href: result.source_url, target: "_blank", rel: "noopener noreferrer" }, result.source_url)
    : h("span", { class: "path" }, result.location);
  return h(
    "li",
    { class: "hit" },
    h("h3", {}, h("a", { href: `#/doc/${encodeURIComponent(result.id)}`, class: "doc-link" }, result.title || result.location)),
    h("div", { class: "meta" }, badge(result.source), " ", where, " · updated ", timeText(result.updated_at), ` · chunk ${result.chunk_index} · score ${result.score.toPrecision(3)}`),
    h("p", { class: "snippet" }, highlighted(result.snippet)),
  );
}

/** The snippet's «hits» as <mark>: split on the markers, never parsed as HTML. */
export function highlighted(snippet) {
  const parts = [];
  const pattern = /«([^»]*)»/g;
  let at = 0;
  for (const match of snippet.matchAll(pattern)) {
    parts.push(snippet.slice(at, match.index), h("mark", {}, match[1]));
    at = match.index + match[0].length;
  }
  parts.push(snippet.slice(at));
  return parts;
}

/** #/doc/<id>: the whole document and its chunks. */
export async function mountDocument(root, [id]) {
  root.append(h("p", {}, h("a", { href: "#/search" }, "← Back to the results")));
  let doc;
  try {
    doc = await post("/tools/get", { id });
  } catch (err) {
    root.append(errorBox(err));
    return;
  }
  const facts = [
    ["Source", doc.source],
    ["Path", doc.source_id],
    ["Type", doc.content_type],
    ["Author", doc.author],
    ["Created", timeText(doc.created_at)],
    ["Updated", timeText(doc.updated_at)],
  ].filter(([, value]) => value);
  root.append(
    h("article", { class: "document" },
      h("h1", {}, doc.title),
      doc.source_url ? h("p", {}, h("a", { href: doc.source_url, target: "_blank", rel: "noopener noreferrer" }, doc.source_url)) : null,
      h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
      doc.metadata && Object.keys(doc.metadata).length ? h("details", {}, h("summary", {}, "Metadata"), jsonBlock(doc.metadata)) : null,
      h("h2", {}, `Chunks (${doc.chunks.length})`),
      h("ol", { class: "chunks", start: 0 }, doc.chunks.map((c) => h("li", { class: "chunk", dataset: { index: c.index } }, h("div", { class: "meta" }, `chunk ${c.index} · ${c.tokens} tokens`), h("pre", { class: "text" }, c.text)))),
      h("details", {}, h("summary", {}, "Whole text"), h("pre", { class: "text body" }, doc.body)),
    ),
  );
  root.querySelector("h1").setAttribute("tabindex", "-1");
  root.querySelector("h1").focus();
}
