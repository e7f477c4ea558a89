// Charts drawn as SVG by hand: three kinds are all the console needs, and no library
// has to be shipped, trusted or kept up to date for them.
import { h } from "./ui.js";

const NS = "http://www.w3.org/2000/svg";
export const PALETTE = ["#1f5fbf", "#e08a00", "#2a9d8f", "#8e44ad", "#c0392b", "#6b7280", "#16a34a", "#db2777"];

const MARK = "#6941c6"; // dashed marks on a line chart (a backtest's regrets)

function s(tag, attrs = {}, ...children) {
  const node = document.createElementNS(NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function frame(width, height, label) {
  return s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": label });
}

export function colourOf(names) {
  const map = new Map();
  [...names].forEach((name, i) => map.set(name, PALETTE[i % PALETTE.length]));
  return map;
}

function legend(colours, extra = []) {
  return h(
    "div",
    { class: "legend" },
    [...colours].map(([name, colour]) => h("span", {}, swatch(colour), name)),
    extra,
  );
}

function swatch(colour) {
  const box = s("svg", { width: 11, height: 11, class: "swatch", "aria-hidden": "true" }, s("rect", { width: 11, height: 11, rx: 2, fill: colour }));
  return box;
}

// Horizontal bars: [{label, value, note}], each bar with its own note (e.g. "$120/month").
export function barChart(rows, { label, format = String }) {
  const width = 560;
  const bar = 22;
  const gap = 10;
  const left = 120;
  const height = Math.max(40, rows.length * (bar + gap) + 10);
  const svg = frame(width, height, label);
  svg.dataset.chart = "bars";
  const max = Math.max(1, ...rows.map((r) => r.value));
  rows.forEach((row, i) => {
    const y = 5 + i * (bar + gap);
    const length = Math.max(row.value > 0 ? 2 : 0, ((width - left - 150) * row.value) / max);
    svg.append(
      s("text", { x: left - 8, y: y + bar / 2 + 4, "text-anchor": "end" }, truncate(row.label, 18)),
      s("rect", { x: left, y, width: length, height: bar, rx: 3, fill: row.colour || PALETTE[0] }, s("title", {}, `${row.label}: ${format(row.value)}`)),
      s("text", { x: left + length + 6, y: y + bar / 2 + 4 }, `${format(row.value)}${row.note ? ` · ${row.note}` : ""}`),
    );
  });
  return svg;
}

function truncate(text, n) {
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
}

function ticks(max, count = 4) {
  if (max <= 0) return [0];
  const raw = max / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((v) => v >= raw) || raw;
  const out = [];
  for (let v = 0; v <= max + step / 2; v += step) out.push(v);
  return out;
}

function axes(svg, box, xMax, yMax, fx, fy, xLabel) {
  const { left, top, width, height } = box;
  for (const v of ticks(yMax)) {
    const y = top + height - (height * v) / (yMax || 1);
    svg.append(
      s("line", { x1: left, x2: left + width, y1: y, y2: y, stroke: "#e5e7eb" }),
      s("text", { x: left - 6, y: y + 4, "text-anchor": "end" }, fy(v)),
    );
  }
  for (const v of ticks(xMax, 5)) {
    const x = left + (width * v) / (xMax || 1);
    svg.append(s("text", { x, y: top + height + 16, "text-anchor": "middle" }, fx(v)));
  }
  svg.append(
    s("line", { x1: left, x2: left + width, y1: top + height, y2: top + height, stroke: "#9ca3af" }),
    s("text", { x: left + width, y: top + height + 32, "text-anchor": "end" }, xLabel),
  );
}

// A run's checkpoints along their steps: x = step, y = size, colour = tier, hollow = not live.
export function stepChart(checkpoints, { label, format }) {
  const width = 760;
  const height = 240;
  const box = { left: 70, top: 22, width: width - 90, height: height - 70 };
  const svg = frame(width, height, label);
  svg.dataset.chart = "steps";
  const xMax = Math.max(1, ...checkpoints.map((c) => c.step));
  const yMax = Math.max(1, ...checkpoints.map((c) => c.size_bytes));
  axes(svg, box, xMax, yMax, (v) => Math.round(v).toLocaleString("en-US"), format, "step");
  const tiers = colourOf(new Set(checkpoints.map((c) => c.tier || "none")));
  for (const c of checkpoints) {
    const live = c.state === "active" || c.state === "writing";
    const colour = tiers.get(c.tier || "none");
    const x = box.left + (box.width * c.step) / xMax;
    const y = box.top + box.height - (box.height * c.size_bytes) / yMax;
    svg.append(
      s(
        "circle",
        { cx: x, cy: y, r: c.pinned ? 7 : 5, fill: live ? colour : "#fff", stroke: colour, "stroke-width": 2, "data-step": c.step },
        s("title", {}, `step ${c.step}: ${c.class}, ${c.state}, ${c.tier || "no tier"}, ${format(c.size_bytes)}${c.pinned ? ", pinned" : ""}`),
      ),
    );
  }
  return h("figure", {}, svg, legend(tiers, [h("span", { class: "muted" }, "hollow: deleted or trashed · large: pinned")]));
}

// Lines over days: [{name, colour, points: [[x, y]]}]; `formatX` names an x tick (by
// default its number). `marks` [{x, title}] are dashed verticals at those x (a backtest's
// regrets), each named by its <title>, and `markNote` says so in the legend.
export function lineChart(series, { label, format, xLabel = "day", formatX = (v) => String(Math.round(v)), marks = [], markNote = "" }) {
  const width = 760;
  const height = 280;
  const box = { left: 70, top: 22, width: width - 90, height: height - 70 };
  const svg = frame(width, height, label);
  svg.dataset.chart = "lines";
  const xs = series.flatMap((line) => line.points.map(([x]) => x));
  const ys = series.flatMap((line) => line.points.map(([, y]) => y));
  const xMax = Math.max(1, ...xs);
  const yMax = Math.max(1e-9, ...ys);
  axes(svg, box, xMax, yMax, formatX, format, xLabel);
  for (const line of series) {
    const d = line.points
      .map(([x, y], i) => `${i ? "L" : "M"}${(box.left + (box.width * x) / xMax).toFixed(1)},${(box.top + box.height - (box.height * y) / yMax).toFixed(1)}`)
      .join(" ");
    svg.append(s("path", { d, fill: "none", stroke: line.colour, "stroke-width": 2.5, "data-series": line.name }, s("title", {}, line.name)));
    if (line.points.length === 1) {
      // a path through one point draws nothing: a dot shows it
      const [[x, y]] = line.points;
      svg.append(s("circle", { cx: box.left + (box.width * x) / xMax, cy: box.top + box.height - (box.height * y) / yMax, r: 4, fill: line.colour }));
    }
  }
  for (const mark of marks) {
    const x = (box.left + (box.width * mark.x) / xMax).toFixed(1);
    svg.append(
      s("line", { x1: x, x2: x, y1: box.top, y2: box.top + box.height, stroke: MARK, "stroke-width": 2, "stroke-dasharray": "5 4", "data-mark": "regret" }, s("title", {}, mark.title)),
    );
  }
  const note = marks.length && markNote ? [h("span", { class: "muted" }, markNote)] : [];
  return h("figure", {}, svg, legend(new Map(series.map((line) => [line.name, line.colour])), note));
}
