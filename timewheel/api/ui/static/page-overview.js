// Overview: due load per minute (GET /stats/due), and this process's figures (GET /stats):
// in flight, callbacks per second (two samples apart), lateness quantiles, failures.

import { ApiError, api } from "./api.js";
import { dueChart } from "./chart.js";
import { h, hhmm, fill } from "./dom.js";
import { zoneLabel } from "./zone.js";

const REFRESH_MS = 5000;
const MIN_WINDOW_S = 2; // shortest window a rate is computed over
const RANGES = [[60, "1 hour"], [180, "3 hours"], [360, "6 hours"], [720, "12 hours"],
  [1440, "24 hours"]];

function seconds(value) {
  if (value === null || value === undefined) return "—";
  if (value < 1) return `${(value * 1000).toFixed(value < 0.01 ? 1 : 0)} ms`;
  return `${value.toFixed(value < 10 ? 2 : 0)} s`;
}

// "4.8 s", "12 s": the length of the window a figure was measured over.
function span(seconds) {
  return `${seconds < 10 ? seconds.toFixed(1) : Math.round(seconds)} s`;
}

function total(callbacks) {
  return Object.values(callbacks).reduce((a, b) => a + b, 0);
}

// The q-quantile of a cumulative histogram ({count, buckets: [[le, cumulative], ...]}),
// interpolated inside its bucket as Prometheus' histogram_quantile does. Above the last
// finite bound: that bound, reported as "over".
export function quantile(hist, q) {
  if (!hist || hist.count <= 0) return null;
  const rank = q * hist.count;
  let lower = 0;
  let below = 0;
  for (const [le, cumulative] of hist.buckets) {
    if (cumulative >= rank) {
      const inBucket = cumulative - below;
      return inBucket > 0 ? lower + ((le - lower) * (rank - below)) / inBucket : le;
    }
    lower = le;
    below = cumulative;
  }
  return { over: lower };
}

function minus(now, before) {
  return {
    count: now.count - before.count,
    sum: now.sum - before.sum,
    buckets: now.buckets.map(([le, c], i) => [le, c - (before.buckets[i] ? before.buckets[i][1] : 0)]),
  };
}

function showQuantile(value) {
  if (value === null) return "—";
  if (typeof value === "object") return `> ${seconds(value.over)}`;
  return seconds(value);
}

// "0.8 / 947 ms" when both share a unit, "12 ms / 2.40 s" otherwise.
function showPair(a, b) {
  const [first, second] = [showQuantile(a), showQuantile(b)];
  const unit = (text) => text.split(" ").pop();
  if (unit(first) === unit(second) && !first.startsWith(">") && first !== "—") {
    return `${first.slice(0, -unit(first).length - 1)} / ${second}`;
  }
  return `${first} / ${second}`;
}

function card(title, id, note, hint) {
  return h("div", { class: "card", title: hint },
    h("div", { class: "card-title" }, title),
    h("div", { class: "card-value", id }, "…"),
    h("div", { class: "card-note", id: `${id}-note`, "data-note": note || "" }, note || ""));
}

// The cards each call fills: until it has answered once, a card shows "…" (loading), and
// "—" with "not loaded: 401" (the whole reason in its title) when that call failed.
const CARDS = { due: ["due-hour"], stats: ["in-flight", "rate", "lateness", "dead"] };

function notLoaded(ids, err) {
  const status = err instanceof ApiError ? (err.status ? String(err.status) : "no answer") :
    "error";
  for (const id of ids) {
    const value = document.getElementById(id);
    const note = document.getElementById(`${id}-note`);
    value.textContent = "—";
    value.classList.add("not-loaded");
    note.textContent = `not loaded: ${status}`;
    note.title = err.message;
  }
}

// Back to "…" and the card's own note, before the figures that came are set.
function loaded(ids) {
  for (const id of ids) {
    const value = document.getElementById(id);
    if (!value.classList.contains("not-loaded")) continue;
    const note = document.getElementById(`${id}-note`);
    value.textContent = "…";
    value.classList.remove("not-loaded");
    note.textContent = note.dataset.note;
    note.removeAttribute("title");
  }
}

export function render(root) {
  let minutes = 180;
  let previous = null;
  let alive = true;
  let timer = null;
  let drawn = false; // the chart was drawn once: a failed refresh leaves it, under the error
  const answered = { due: false, stats: false }; // each call's cards were filled once

  const range = h("select", { id: "range", onchange: () => { minutes = Number(range.value); refresh(); } },
    RANGES.map(([value, label]) => h("option", { value: String(value), selected: value === minutes }, label)));
  const chartBox = h("div", { class: "chart-box", id: "due-chart" }, h("p", { class: "muted" }, "Loading…"));
  const summary = h("p", { class: "muted", id: "due-summary" });
  const footnote = h("p", { class: "muted small", id: "process-note" });
  const error = h("p", { class: "error", id: "overview-error", hidden: true });

  root.append(
    h("h1", {}, "Overview"),
    error,
    h("section", { class: "cards" },
      card("Due next hour", "due-hour", "whole wheel"),
      card("In flight", "in-flight", "attempts being sent"),
      card("Callbacks / s", "rate", "measuring…"),
      card("Lateness p50 / p99", "lateness", "first attempts",
        "How long after its due time a first attempt started (after its creation, for a task " +
        "created with an execute_at already past: it could not start sooner)"),
      card("Dead letters", "dead", "whole wheel")),
    h("section", { class: "panel" },
      h("div", { class: "panel-head" },
        h("h2", {}, "Due per minute ", h("span", { class: "muted small", id: "chart-zone" })),
        h("label", { class: "inline" }, "for the next ", range)),
      summary, chartBox),
    footnote);

  async function refreshDue(background) {
    const load = await api.get("stats/due", { minutes }, { background });
    if (!alive) return;
    loaded(CARDS.due);
    answered.due = true;
    const points = load.minutes;
    const sum = points.reduce((a, p) => a + p.due, 0);
    const peak = points.reduce((best, p) => (p.due > best.due ? p : best), { due: 0 });
    document.getElementById("due-hour").textContent =
      String(points.slice(0, 60).reduce((a, p) => a + p.due, 0));
    summary.textContent = sum ?
      `${sum} task${sum === 1 ? "" : "s"} due in the next ${points.length} minutes; busiest minute ${hhmm(new Date(peak.minute))} ${zoneLabel(new Date(peak.minute))} with ${peak.due}.` :
      `No tasks due in the next ${points.length} minutes.`;
    if (load.clamped) summary.textContent += ` Limited to ${points.length} minutes (${load.buckets} buckets).`;
    document.getElementById("chart-zone").textContent =
      `(times in ${zoneLabel(new Date(points.length ? points[0].minute : Date.now()))})`;
    fill(chartBox, dueChart(points));
    drawn = true;
  }

  async function refreshStats(background) {
    const stats = await api.get("stats", undefined, { background });
    if (!alive) return;
    loaded(CARDS.stats);
    answered.stats = true;
    const set = (id, text, note) => {
      document.getElementById(id).textContent = text;
      if (note !== undefined) document.getElementById(`${id}-note`).textContent = note;
    };
    set("in-flight", String(stats.in_flight));
    set("dead", String(stats.dead_letters), `whole wheel; attempts here since start: ` +
      `${stats.callbacks.failed} failed, ${stats.callbacks.retried} retried`);
    const first = stats.lateness.first;
    // Rates and recent lateness compare two samples of the same process at least
    // MIN_WINDOW_S apart: a refresh sooner than that (a range change) keeps the older sample,
    // so the window shown is never "the last 0 s".
    const same = previous && previous.process === stats.process;
    const dt = same ? (Date.parse(stats.now) - Date.parse(previous.now)) / 1000 : 0;
    const windowed = same && dt >= MIN_WINDOW_S;
    if (windowed) {
      const done = total(stats.callbacks) - total(previous.callbacks);
      set("rate", (done / dt).toFixed(done / dt < 10 ? 1 : 0), `over the last ${span(dt)}`);
    }
    let hist = first;
    let note = "first attempts, since start";
    if (windowed && first && previous.lateness.first) {
      const recent = minus(first, previous.lateness.first);
      if (recent.count > 0) {
        hist = recent;
        note = `first attempts, last ${span(dt)}`;
      }
    }
    set("lateness", showPair(quantile(hist, 0.5), quantile(hist, 0.99)),
      hist && hist.count ? `${note} (${hist.count})` : "no callbacks yet");
    footnote.textContent = `Callbacks, in flight and lateness: the process that answered ` +
      `(${stats.process}), since it started. Due load and dead letters: the whole wheel. ` +
      `Updated every ${REFRESH_MS / 1000} s.`;
    if (!same || windowed) previous = stats;
  }

  // The timer's refresh is a background one: after the token dialog was cancelled, its 401
  // does not open the dialog again (api.js); opening the page or changing the range does.
  async function refresh({ background = false } = {}) {
    const [due, stats] = await Promise.allSettled([refreshDue(background),
      refreshStats(background)]);
    if (!alive) return;
    const failed = [due, stats].find((outcome) => outcome.status === "rejected");
    // Never drawn: the chart panel says why instead of "Loading…" for ever.
    if (due.status === "rejected" && !drawn) {
      fill(chartBox, h("p", { class: "error", id: "due-error" },
        `Could not load the due load: ${due.reason.message}`));
    }
    // Never filled: the cards say they could not be loaded, not "…" as if still loading. Once
    // filled, a failed refresh leaves their figures, under the error.
    for (const [name, outcome] of [["due", due], ["stats", stats]]) {
      if (outcome.status === "rejected" && !answered[name]) notLoaded(CARDS[name], outcome.reason);
    }
    error.hidden = !failed;
    if (failed) error.textContent = `Could not load the figures: ${failed.reason.message}`;
  }

  refresh();
  timer = window.setInterval(() => refresh({ background: true }), REFRESH_MS);
  return () => {
    alive = false;
    window.clearInterval(timer);
  };
}
