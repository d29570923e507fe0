// Renders what a tool returned: plain JSON, text, or an MCP CallToolResult ({content: [blocks],
// structuredContent?, isError?}) with its text, images, audio and resources; and a code-mode
// script's trace of inner calls.

import { badge, duration, errorBox, h, jsonBlock } from "./dom.js";

/** True for {content: [{type: …}, …]}: an upstream tool's (or MCP.content's) result. */
export function isMcpResult(value) {
  return !!value && typeof value === "object" && Array.isArray(value.content) && value.content.every((b) => b && typeof b.type === "string");
}

export function resultView(result, trace) {
  const box = h("div", { class: "result" });
  if (isMcpResult(result)) {
    if (result.isError) box.append(h("p", { class: "error" }, "The tool reported an error (isError)."));
    box.append(h("div", { class: "blocks" }, result.content.map(block)));
    if (result.structuredContent !== undefined) box.append(h("details", {}, h("summary", {}, "structuredContent"), jsonBlock(result.structuredContent)));
  } else if (typeof result === "string") {
    box.append(h("pre", { class: "text" }, result));
  } else {
    box.append(jsonBlock(result, "result"));
  }
  if (trace) box.append(traceView(trace));
  return box;
}

/** A failed call: the server's words, and for a script the line and the calls made so far. */
export function failureView(err) {
  const box = h("div", { class: "result failed" }, errorBox(err));
  const data = err.data && err.data.data;
  if (data && typeof data === "object") {
    if (data.line) box.append(h("p", { class: "muted" }, `script line ${data.line}`, err.data.code ? ` · ${err.data.code}` : ""));
    if (data.trace) box.append(traceView(data.trace));
  } else if (err.data !== undefined) {
    box.append(h("details", {}, h("summary", {}, "Error data"), jsonBlock(err.data)));
  }
  return box;
}

function block(b) {
  switch (b.type) {
    case "text":
      return h("div", { class: "block text" }, textBlock(b.text));
    case "image":
      return h("figure", { class: "block image" }, h("img", { src: dataUrl(b.mimeType, b.data, "image/"), alt: `image (${b.mimeType})` }), h("figcaption", { class: "muted" }, b.mimeType));
    case "audio":
      return h("figure", { class: "block audio" }, h("audio", { controls: true, src: dataUrl(b.mimeType, b.data, "audio/") }), h("figcaption", { class: "muted" }, b.mimeType));
    case "resource":
      return resourceBlock(b.resource || {});
    case "resource_link":
      return h("div", { class: "block resource" }, badge("resource link"), " ", h("strong", {}, b.name || ""), " ", uriText(b.uri), b.description ? h("p", {}, b.description) : null);
    default:
      return h("div", { class: "block" }, badge(String(b.type)), jsonBlock(b));
  }
}

/** Text that holds JSON is shown pretty; any other text as it is. */
function textBlock(text) {
  const trimmed = (text || "").trim();
  if (trimmed.startsWith("{") || trimmed.startsWith("[")) {
    try {
      return jsonBlock(JSON.parse(trimmed));
    } catch {
      // Not JSON after all: plain text below.
    }
  }
  return h("pre", { class: "text" }, text);
}

function resourceBlock(r) {
  const head = h("div", { class: "meta" }, badge("resource"), " ", uriText(r.uri), r.mimeType ? ` · ${r.mimeType}` : "");
  if (typeof r.text === "string") return h("div", { class: "block resource" }, head, textBlock(r.text));
  if (typeof r.blob === "string") {
    const name = (r.uri || "resource").split("/").pop() || "resource";
    return h("div", { class: "block resource" }, head, h("a", { href: dataUrl(r.mimeType || "application/octet-stream", r.blob), download: name }, `Download ${name}`));
  }
  return h("div", { class: "block resource" }, head, jsonBlock(r));
}

/** A link only for web addresses; any other URI scheme is shown as text. */
function uriText(uri) {
  if (typeof uri === "string" && /^https?:\/\//i.test(uri)) return h("a", { href: uri, target: "_blank", rel: "noopener noreferrer" }, uri);
  return h("code", {}, String(uri || ""));
}

/** A data: URL for base64 data; the MIME type must look like one (and of `kind`, when given). */
function dataUrl(mime, data, kind) {
  const type = /^[\w.+-]+\/[\w.+-]+$/.test(mime || "") && (!kind || mime.startsWith(kind)) ? mime : "application/octet-stream";
  return `data:${type};base64,${String(data || "").replace(/[^A-Za-z0-9+/=]/g, "")}`;
}

/** The inner calls of a code-mode script, in the order they finished. */
export function traceView(trace) {
  const calls = trace.calls || [];
  const rows = calls.map((c, i) =>
    h("tr", { class: `status-${c.status}` }, h("td", {}, String(i + 1)), h("td", {}, h("code", {}, c.tool)), h("td", {}, badge(c.status, c.status === "ok" ? "ok" : "bad"), c.code ? ` ${c.code}` : ""), h("td", { class: "num" }, duration(c.ms)), h("td", { class: "num" }, `${c.bytes} B`)),
  );
  const notes = [
    `${trace.started ?? calls.length} inner call${trace.started === 1 ? "" : "s"} started`,
    trace.unlisted ? `${trace.unlisted} more not listed` : null,
    trace.log_lines_dropped ? `${trace.log_lines_dropped} log lines dropped` : null,
  ].filter(Boolean);
  return h(
    "section",
    { class: "trace", "aria-label": "Trace of inner calls" },
    h("h3", {}, "Trace"),
    h("p", { class: "muted" }, notes.join(" · ")),
    calls.length ? h("div", { class: "table-wrap" }, h("table", {}, h("thead", {}, h("tr", {}, ["#", "tool", "status", "time", "result"].map((t) => h("th", { scope: "col" }, t)))), h("tbody", {}, rows))) : null,
    trace.truncated ? h("p", { class: "warn" }, `Result cut: ${trace.truncated.note} (${trace.truncated.original_bytes} bytes, limit ${trace.truncated.limit_bytes})`) : null,
  );
}
