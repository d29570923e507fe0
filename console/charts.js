// Small inline-SVG charts and the reading of Prometheus' text format they draw from. No chart
// library: a few bars and labels are all the Activity page needs.

const SVG = "http://www.w3.org/2000/svg";

function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== undefined && v !== null) el.setAttribute(k, String(v));
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

/**
 * Prometheus text format → [{name, labels, value}]. Comments and malformed lines are skipped;
 * label values are unescaped (\\, \", \n).
 */
export function parsePrometheus(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([A-Za-z_:][\w:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const labels = {};
    for (const m of (match[3] || "").matchAll(/([A-Za-z_]\w*)="((?:[^"\\]|\\.)*)"/g)) {
      labels[m[1]] = m[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
    }
    const value = match[4] === "+Inf" ? Infinity : Number(match[4]);
    if (!Number.isNaN(value)) samples.push({ name: match[1], labels, value });
  }
  return samples;
}

/**
 * Quantiles per `label` value from a histogram's cumulative buckets, interpolating linearly
 * inside the bucket that holds the rank (as Prometheus' histogram_quantile does).
 * → [{key, count, quantiles: {0.5: seconds, …}}], busiest first.
 */
export function histogramQuantiles(samples, metric, label, qs = [0.5, 0.9, 0.99]) {
  const groups = new Map();
  for (const sample of samples) {
    if (sample.name !== `${metric}_bucket`) continue;
    const key = sample.labels[label];
    const le = sample.labels.le === "+Inf" ? Infinity : Number(sample.labels.le);
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push({ le, count: sample.value });
  }
  const out = [];
  for (const [key, buckets] of groups) {
    buckets.sort((a, b) => a.le - b.le);
    const total = buckets.length ? buckets[buckets.length - 1].count : 0;
    if (!total) continue;
    const quantiles = {};
    for (const q of qs) quantiles[q] = quantile(buckets, total, q);
    out.push({ key, count: total, quantiles });
  }
  return out.sort((a, b) => b.count - a.count);
}

function quantile(buckets, total, q) {
  const rank = q * total;
  let lowerLe = 0;
  let lowerCount = 0;
  for (const { le, count } of buckets) {
    if (count >= rank) {
      // Past the last finite bound the best answer is that bound.
      if (le === Infinity) return lowerLe;
      const inBucket = count - lowerCount;
      return inBucket ? lowerLe + ((le - lowerLe) * (rank - lowerCount)) / inBucket : le;
    }
    lowerLe = le;
    lowerCount = count;
  }
  return lowerLe;
}

/**
 * Bars over time: [{label, values: [n per series]}] with series [{name, class}], stacked.
 * Labels of every `labelEvery`-th bar go under the axis.
 */
export function stackedBars(points, series, { title, labelEvery = 5, height = 140, width = 600 } = {}) {
  const pad = { left: 34, right: 8, top: 10, bottom: 22 };
  const max = Math.max(1, ...points.map((p) => p.values.reduce((a, b) => a + b, 0)));
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const step = plotW / Math.max(1, points.length);
  const y = (v) => pad.top + plotH - (v / max) * plotH;
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": title }, s("title", {}, title));
  svg.append(s("line", { x1: pad.left, x2: width - pad.right, y1: y(0), y2: y(0), class: "axis" }));
  svg.append(s("text", { x: pad.left - 4, y: y(max) + 4, class: "tick", "text-anchor": "end" }, String(max)));
  svg.append(s("text", { x: pad.left - 4, y: y(0), class: "tick", "text-anchor": "end" }, "0"));
  points.forEach((p, i) => {
    let base = 0;
    const x = pad.left + i * step + step * 0.1;
    p.values.forEach((v, k) => {
      if (!v) return;
      svg.append(s("rect", { x, width: Math.max(1, step * 0.8), y: y(base + v), height: y(base) - y(base + v), class: series[k].class }, s("title", {}, `${p.label}: ${v} ${series[k].name}`)));
      base += v;
    });
    if (i % labelEvery === 0) svg.append(s("text", { x: x + step * 0.4, y: height - 6, class: "tick", "text-anchor": "middle" }, p.label));
  });
  return svg;
}

/**
 * Horizontal bars per row with several measures each: rows [{label, values: [number]}],
 * measures [{name, class}]; `format(v)` writes a value.
 */
export function groupedHBars(rows, measures, { title, format = String, width = 600 } = {}) {
  const labelW = width < 500 ? 90 : 150;
  const barH = 9;
  const rowH = measures.length * (barH + 2) + 10;
  const height = rows.length * rowH + 8;
  const max = Math.max(Number.MIN_VALUE, ...rows.flatMap((r) => r.values));
  const plotW = width - labelW - 90;
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": title }, s("title", {}, title));
  rows.forEach((row, i) => {
    const top = 4 + i * rowH;
    svg.append(s("text", { x: labelW - 6, y: top + rowH / 2, class: "label", "text-anchor": "end" }, row.label.length > labelW / 7 ? `${row.label.slice(0, Math.floor(labelW / 7) - 1)}…` : row.label));
    row.values.forEach((v, k) => {
      const w = Math.max(1, (v / max) * plotW);
      const yy = top + k * (barH + 2);
      svg.append(s("rect", { x: labelW, y: yy, width: w, height: barH, class: measures[k].class }, s("title", {}, `${row.label} ${measures[k].name}: ${format(v)}`)));
      svg.append(s("text", { x: labelW + w + 4, y: yy + barH - 1, class: "tick" }, `${measures[k].name} ${format(v)}`));
    });
  });
  return svg;
}

/** A legend for the series of a chart. */
export function legend(series) {
  const box = document.createElement("p");
  box.className = "legend";
  for (const item of series) {
    const swatch = document.createElement("span");
    swatch.className = `swatch ${item.class}`;
    box.append(swatch, ` ${item.name} `);
  }
  return box;
}
