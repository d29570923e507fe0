// The console's shell: routes on location.hash (#/search, #/tools/echo, …) to one module per
// area, each loaded when first opened. A view is `mount(root, args)` → an optional cleanup
// function that stops its polling when the user leaves it.

import { accessInfo, logout } from "./api.js";
import { errorBox, replace } from "./dom.js";

const ROUTES = {
  search: () => import("./search.js"),
  doc: () => import("./search.js").then((m) => ({ mount: m.mountDocument })),
  sources: () => import("./sources.js"),
  tools: () => import("./tools.js"),
  approvals: () => import("./approvals.js"),
  activity: () => import("./activity.js"),
  chat: () => import("./chat.js"),
};

const main = document.getElementById("main");
let cleanup = null;
let generation = 0;

/** "#/tools/github__search?x" → {name: "tools", args: ["github__search"]} */
function parse(hash) {
  const path = hash.replace(/^#\/?/, "").split("?")[0];
  const [name, ...args] = path.split("/").map((part) => decodeURIComponent(part));
  return { name: ROUTES[name] ? name : "search", args };
}

async function route() {
  // In-page anchors (the skip link) are not routes.
  if (location.hash && !location.hash.startsWith("#/")) return;
  const { name, args } = parse(location.hash);
  const mine = ++generation;
  if (cleanup) cleanup();
  cleanup = null;
  for (const link of document.querySelectorAll("#nav a")) {
    const active = link.dataset.route === name || (name === "doc" && link.dataset.route === "search");
    if (active) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const root = document.createElement("div");
  root.className = `view view-${name}`;
  replace(main, root);
  try {
    const module = await ROUTES[name]();
    if (mine !== generation) return;
    const stop = await module.mount(root, args);
    if (mine !== generation) {
      if (typeof stop === "function") stop();
      return;
    }
    cleanup = typeof stop === "function" ? stop : null;
  } catch (err) {
    if (mine === generation) root.append(errorBox(err, "This page failed to open:"));
  }
  ready();
}

let announced = false;

/** Marks the first rendered view: the browser test measures the first load up to here. */
function ready() {
  if (announced) return;
  announced = true;
  performance.mark("ctx-console-ready");
  document.documentElement.dataset.ready = "true";
}

async function hideWhatTheTokenMayNotUse() {
  const info = await accessInfo();
  if (!info.scoped) return;
  const link = document.querySelector('#nav a[data-route="approvals"]');
  if (link) link.parentElement.hidden = true;
}

document.getElementById("logout").addEventListener("click", () => logout());
window.addEventListener("hashchange", route);
route();
hideWhatTheTokenMayNotUse();
