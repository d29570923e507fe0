// Sources: each connector's health and index counts (GET /tools/sources), and syncs started
// from here (POST /sources/{name}/sync) watched through GET /sources/sync.

import { ApiError, get, post } from "./api.js";
import { badge, duration, errorBox, h, relative, replace, timeText } from "./dom.js";

const POLL_MS = 500; // while a sync runs: its progress
const IDLE_MS = 3000; // otherwise: a sync another client started shows up too

export async function mount(root) {
  const list = h("div", { class: "sources", "aria-live": "polite" });
  const note = h("div");
  root.append(h("h1", {}, "Sources"), note, list);

  let sources = [];
  let jobs = new Map(); // source name → its latest SyncJob
  let jobsApi = true; // false when this server has no sync jobs API (an older ctx)
  let timer = null;
  let stopped = false;
  const problems = new Map(); // source name → the error of its last sync request

  async function loadSources() {
    try {
      sources = (await get("/tools/sources")).sources;
      replace(note);
    } catch (err) {
      replace(note, errorBox(err));
    }
  }

  async function loadJobs() {
    if (!jobsApi) return;
    try {
      const body = await get("/sources/sync");
      jobs = new Map(body.jobs.map((job) => [job.source, job]));
    } catch (err) {
      // 404: this server predates the sync API; 403: a scoped token. Either way no button works.
      if (err instanceof ApiError && (err.status === 404 || err.status === 405)) jobsApi = false;
      else if (err instanceof ApiError && err.status === 403) jobsApi = { forbidden: err.message };
      else throw err;
    }
  }

  let shown = "";
  const fullChecked = new Set(); // sources whose "full" box is ticked, kept across renders

  function render() {
    // Unchanged state is not drawn again: a poll must not take the focus or a ticked box away.
    const key = JSON.stringify([sources, [...jobs.values()], [...problems].map(([k, e]) => [k, e.message])]);
    if (key === shown) return;
    shown = key;
    const focused = document.activeElement;
    const where = list.contains(focused) ? [focused.closest("[data-source]")?.dataset.source, focused.getAttribute("name") || focused.getAttribute("type")] : null;
    replace(list, sources.length ? sources.map((s) => card(s, jobs.get(s.name), problems.get(s.name), jobsApi, start, fullChecked)) : h("p", { class: "muted" }, "No sources are configured ([connectors.*] in ctx.toml)."));
    if (where) {
      const again = [...list.querySelectorAll("[data-source]")].find((el) => el.dataset.source === where[0]);
      const control = again && (again.querySelector(`[name="${where[1]}"]`) || again.querySelector(`[type="${where[1]}"]`));
      if (control) control.focus();
    }
  }

  async function start(name, full) {
    problems.delete(name);
    try {
      const job = await post(`/sources/${encodeURIComponent(name)}/sync`, full ? { full: true } : {});
      jobs.set(name, job);
    } catch (err) {
      problems.set(name, err);
    }
    render();
    poll();
  }

  const anyRunning = () => [...jobs.values()].some((job) => job.state === "running");

  // Polls the jobs, fast while one runs; when the last one ends, the counts are read again.
  function poll() {
    clearTimeout(timer);
    if (stopped || jobsApi !== true) return;
    timer = setTimeout(async () => {
      const wasRunning = anyRunning();
      try {
        await loadJobs();
        if (wasRunning && !anyRunning()) await loadSources();
      } catch (err) {
        replace(note, errorBox(err));
      }
      render();
      poll();
    }, anyRunning() ? POLL_MS : IDLE_MS);
  }

  await Promise.all([loadSources(), loadJobs().catch((err) => replace(note, errorBox(err)))]);
  render();
  poll();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

function card(source, job, problem, jobsApi, start, fullChecked) {
  const health = source.healthy ? badge("healthy", "ok") : badge("unhealthy", "bad");
  const lastSeconds = source.last_sync_seconds ?? (job && job.summary ? job.summary.seconds : null);
  const running = job && job.state === "running";
  const full = h("input", { type: "checkbox", name: "full", checked: fullChecked.has(source.name) });
  full.addEventListener("change", () => (full.checked ? fullChecked.add(source.name) : fullChecked.delete(source.name)));
  const controls =
    jobsApi === false
      ? null
      : jobsApi && jobsApi.forbidden
        ? h("p", { class: "muted" }, `Syncing needs server.auth_token: ${jobsApi.forbidden}`)
        : h(
            "form",
            {
              class: "row sync",
              onsubmit: (event) => {
                event.preventDefault();
                start(source.name, full.checked);
              },
            },
            h("button", { type: "submit", disabled: running || !source.configured, "aria-label": `Sync ${source.name}` }, running ? "Syncing…" : "Sync now"),
            h("label", { class: "check" }, full, " full (re-read everything)"),
          );
  return h(
    "article",
    { class: "card source", dataset: { source: source.name } },
    h("h2", {}, source.name, " ", health, source.configured ? null : [" ", badge("not configured", "warn")]),
    h(
      "dl",
      { class: "facts" },
      h("dt", {}, "Documents"), h("dd", { class: "documents" }, String(source.documents)),
      h("dt", {}, "Chunks"), h("dd", { class: "chunks" }, String(source.chunks)),
      h("dt", {}, "Last sync"), h("dd", { class: "last-sync" }, timeText(source.last_sync), source.last_sync ? ` (${relative(source.last_sync)})` : null),
      h("dt", {}, "Took"), h("dd", { class: "took" }, lastSeconds === null || lastSeconds === undefined ? "–" : duration(lastSeconds * 1000)),
    ),
    source.notes ? h("p", { class: "notes" }, source.notes) : null,
    source.last_error ? h("div", { class: "error" }, "Last sync failed: ", source.last_error) : null,
    job ? progress(job) : null,
    problem ? errorBox(problem) : null,
    controls,
  );
}

/** A job: a progress bar while it runs (exact when the source estimated its size), then its summary. */
function progress(job) {
  const box = h("div", { class: `job job-${job.state}`, dataset: { state: job.state } });
  if (job.state === "running") {
    const bar = h("progress", { max: job.estimate || null, value: job.estimate ? Math.min(job.seen, job.estimate) : null, "aria-label": `Sync of ${job.source}` });
    box.append(bar, h("span", {}, ` ${job.seen}${job.estimate ? ` of ${job.estimate}` : ""} items seen · started ${relative(job.started_at)}`));
    return box;
  }
  const s = job.summary || {};
  const head = job.state === "done" ? "Sync finished" : "Sync failed";
  box.append(
    h("strong", {}, head),
    job.finished_at ? [" ", timeText(job.finished_at)] : null,
    s.seconds !== undefined && s.seconds !== null ? ` in ${duration(s.seconds * 1000)}` : null,
    h("span", { class: "summary" }, ": ", ["added", "updated", "deleted", "unchanged", "skipped", "errors"].map((k) => `${s[k] ?? 0} ${k}`).join(", ")),
    s.error ? h("div", { class: "error" }, s.error) : null,
    s.embed_error ? h("div", { class: "notice" }, "Embedding stopped (documents written without vectors): ", s.embed_error) : null,
  );
  return box;
}
