// DOM building blocks shared by every view. Everything the server sends is untrusted (tool
// descriptions, parameters, results), so nodes are built with createElement and text goes in as
// text nodes: nothing here parses HTML.

/**
 * h("button", {class: "primary", onclick: fn, "aria-label": "Run"}, "Run") → an element.
 * Props: `class`, `text`, `dataset` (object), `on<event>` (a function: an event listener),
 * boolean values (set as presence attributes, or as properties for `checked`, `value`,
 * `disabled`, …), anything else as an attribute. Children: nodes, strings, numbers, arrays;
 * null, undefined and false are skipped.
 */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (PROPERTIES.has(key)) el[key] = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

// Set as properties, not attributes: they are live state (the attribute is only the default).
const PROPERTIES = new Set(["value", "checked", "disabled", "hidden", "open", "indeterminate"]);

/** Appends children (see `h`) to `el`. */
export function append(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replaces the children of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** Pretty JSON in a <pre>, as text. */
export function jsonBlock(value, label) {
  const text = typeof value === "string" ? value : JSON.stringify(value, null, 2);
  return h("pre", { class: "json", "aria-label": label || null }, text === undefined ? "undefined" : text);
}

/**
 * A server error as the server words it: its message, then one line per detail (the JSON
 * pointer of the field and what was wrong with it). `err` is an ApiError or any Error.
 */
export function errorBox(err, prefix) {
  const box = h("div", { class: "error", role: "alert" });
  append(box, [prefix ? h("strong", {}, prefix, " ") : null, err.message || String(err)]);
  if (err.code) box.dataset.code = err.code;
  if (Array.isArray(err.details) && err.details.length) {
    box.append(h("ul", {}, err.details.map((d) => h("li", {}, h("code", {}, d.path || "(whole input)"), " ", d.message))));
  }
  return box;
}

/** A small label: h("span", {class: "badge <kind>"}). */
export function badge(text, kind) {
  return h("span", { class: "badge" + (kind ? " " + kind : "") }, text);
}

/** "2026-11-29 04:53:41" in local time, with the ISO time as a tooltip. */
export function timeText(iso) {
  if (!iso) return h("span", { class: "muted" }, "never");
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return h("span", {}, String(iso));
  return h("time", { datetime: iso, title: iso }, localTime(date));
}

export function localTime(date) {
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
}

/** "12 s ago", "3 min ago", "in 14 min". */
export function relative(iso, now = Date.now()) {
  const ms = new Date(iso).getTime() - now;
  if (Number.isNaN(ms)) return "";
  const abs = Math.abs(ms) / 1000;
  const text = abs < 60 ? `${Math.round(abs)} s` : abs < 3600 ? `${Math.round(abs / 60)} min` : abs < 86400 ? `${Math.round(abs / 3600)} h` : `${Math.round(abs / 86400)} d`;
  return ms < 0 ? `${text} ago` : `in ${text}`;
}

/** Milliseconds for people: "0.8 ms", "120 ms", "2.4 s". */
export function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "–";
  if (ms < 10) return `${ms.toFixed(1)} ms`;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

/** A heading with an optional line of help under it. */
export function section(title, ...children) {
  return h("section", { class: "panel" }, h("h2", {}, title), children);
}

/** Runs `fn` every `ms` until the returned stop function is called; never overlaps itself. */
export function every(ms, fn) {
  let stopped = false;
  let timer = null;
  const tick = async () => {
    if (stopped) return;
    try {
      await fn();
    } catch (err) {
      // A failed poll is shown by `fn` itself where it matters; the next tick tries again.
      console.warn(err);
    }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  timer = setTimeout(tick, ms);
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

/** A <label> + control pair with a place for the field's error under it. */
export function field(labelText, control, help) {
  const id = control.id || (control.id = uid("f"));
  return h("div", { class: "field" }, h("label", { for: id }, labelText), control, help ? h("small", { class: "help" }, help) : null);
}

let counter = 0;
export function uid(prefix) {
  counter += 1;
  return `${prefix}-${counter}`;
}
