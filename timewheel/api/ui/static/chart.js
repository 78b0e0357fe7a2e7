// The due-load chart: one bar per minute, drawn as SVG (no library).

import { hhmm, svg } from "./dom.js";
import { fields, zoneLabel } from "./zone.js";

const WIDTH = 960;
const HEIGHT = 260;
const M = { top: 12, right: 12, bottom: 28, left: 48 };

// 1, 2, 5, 10, 20, 50, ... at or above `value`: a round top for the y axis.
function niceCeil(value) {
  if (value <= 5) return 5;
  const step = 10 ** Math.floor(Math.log10(value));
  for (const m of [1, 2, 5, 10]) if (m * step >= value) return m * step;
  return 10 * step;
}

// Minutes between x labels, so that a label falls every ~80 px.
function labelEvery(minutes) {
  const plot = WIDTH - M.left - M.right;
  const wanted = (minutes * 80) / plot;
  for (const m of [5, 10, 15, 30, 60, 120, 180, 240, 360]) if (m >= wanted) return m;
  return 720;
}

// points: [{minute: RFC 3339, due: n}, ...], one per minute from the current minute on.
export function dueChart(points) {
  const n = Math.max(points.length, 1);
  const max = points.reduce((acc, p) => Math.max(acc, p.due), 0);
  const top = niceCeil(max);
  const plotW = WIDTH - M.left - M.right;
  const plotH = HEIGHT - M.top - M.bottom;
  const barW = plotW / n;
  const y = (v) => M.top + plotH - (v / top) * plotH;

  // The x labels are wall-clock times in this zone (the panel's heading names it too).
  const zone = zoneLabel(new Date(points.length ? points[0].minute : Date.now()));
  const root = svg("svg", {
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`, class: "chart", role: "img",
    "aria-label": `Tasks due per minute for the next ${points.length} minutes; at most ${max}`,
  });
  const grid = svg("g", { class: "grid" });
  for (const v of [0, top / 2, top]) {
    grid.append(
      svg("line", { x1: M.left, x2: WIDTH - M.right, y1: y(v), y2: y(v) }),
      svg("text", { x: M.left - 6, y: y(v) + 4, "text-anchor": "end" }, String(v)));
  }
  root.append(grid);

  const axis = svg("g", { class: "axis" });
  const every = labelEvery(n);
  points.forEach((p, i) => {
    const d = new Date(p.minute);
    const f = fields(d);
    if ((f.hours * 60 + f.minutes) % every === 0) {
      const x = M.left + i * barW;
      axis.append(
        svg("line", { x1: x, x2: x, y1: M.top + plotH, y2: M.top + plotH + 4 }),
        svg("text", { x, y: HEIGHT - 8, "text-anchor": "middle" }, hhmm(d)));
    }
  });
  root.append(axis);

  const bars = svg("g", { class: "bars" });
  points.forEach((p, i) => {
    if (p.due <= 0) return;
    const top = y(p.due);
    bars.append(svg("rect", {
      x: M.left + i * barW + (barW > 3 ? 0.5 : 0), y: top,
      width: Math.max(barW - (barW > 3 ? 1 : 0), 0.8), height: M.top + plotH - top,
      "data-minute": p.minute, "data-due": p.due,
    }, svg("title", {}, `${hhmm(new Date(p.minute))} ${zone}: ${p.due} due`)));
  });
  root.append(bars);
  return root;
}
