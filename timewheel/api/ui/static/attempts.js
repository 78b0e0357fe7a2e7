// A task's attempt history as a timeline (GET /tasks/{key}/attempts, oldest first): each
// attempt's number, start time with its zone, outcome, status or error, duration, process, and
// the response (headers and body excerpt) behind a disclosure. Shown on the task page.

import { api, seg } from "./api.js";
import { badge, fill, h } from "./dom.js";
import { fields, zoneLabel } from "./zone.js"; // the dashboard's UTC / local toggle

const pad = (n, width = 2) => String(n).padStart(width, "0");

// "2027-01-15 08:00:00.005 UTC", to the millisecond, zone named; the RFC 3339 value in the
// element's datetime and title.
function zoned(iso, missing = "—") {
  if (!iso) return h("span", { class: "muted" }, missing);
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  const f = fields(d);
  return h("time", { datetime: iso, title: iso },
    `${f.year}-${pad(f.month)}-${pad(f.day)} ${pad(f.hours)}:${pad(f.minutes)}:` +
    `${pad(f.seconds)}.${pad(d.getUTCMilliseconds(), 3)} ${zoneLabel(d)}`);
}

function duration(ms) {
  if (ms === null || ms === undefined) return null;
  return ms < 10_000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`;
}

// What came back: "HTTP 503", or the error in words, or nothing for an unanswered attempt.
function result(attempt) {
  const parts = [];
  if (attempt.status_code !== null) parts.push(h("span", { class: "code" }, `HTTP ${attempt.status_code}`));
  if (attempt.error) parts.push(h("span", { class: "error" }, attempt.error));
  return parts.length ? parts : h("span", { class: "muted" }, "no answer");
}

function response(attempt) {
  const headers = Object.entries(attempt.response_headers || {});
  if (attempt.response_body === null && !headers.length) return null;
  const size = attempt.response_body === null ? "no body kept"
    : `${new TextEncoder().encode(attempt.response_body).length} bytes` +
      (attempt.response_body_truncated ? ", cut" : "");
  return h("details", { class: "response" },
    h("summary", {}, `Response (${size})`),
    headers.length ? h("dl", { class: "response-headers" },
      headers.map(([name, value]) => [h("dt", {}, name), h("dd", {}, value)])) : null,
    attempt.response_body !== null
      ? h("pre", { class: "response-body" }, attempt.response_body,
        attempt.response_body_truncated ? h("span", { class: "muted" }, "\n… (cut)") : null)
      : null);
}

function entry(attempt) {
  const next = attempt.next_attempt_at
    ? h("div", { class: "next muted" }, "next attempt at ",
      zoned(attempt.next_attempt_at))
    : null;
  return h("li", { class: `attempt attempt-${attempt.outcome}`, "data-attempt": attempt.attempt },
    h("div", { class: "attempt-head" },
      h("strong", { class: "attempt-number" }, `#${attempt.attempt}`),
      badge(attempt.outcome),
      // Only attempts that got an outcome have a start time: a lost one's process is gone,
      // a cancelled one was never sent.
      zoned(attempt.started_at, attempt.outcome === "cancelled" ? "not sent" : "time unknown"),
      h("span", { class: "attempt-result" }, result(attempt)),
      duration(attempt.duration_ms) && h("span", { class: "muted duration" },
        duration(attempt.duration_ms)),
      attempt.process && h("span", { class: "muted process", title: "process (host:pid)" },
        attempt.process)),
    next,
    response(attempt));
}

// The panel; it loads itself, and again on Refresh.
export function attemptsPanel(key) {
  const list = h("div", { id: "attempt-list" }, h("p", { class: "muted" }, "Loading…"));
  const count = h("span", { class: "muted small", id: "attempt-count" });

  async function load() {
    try {
      const { attempts } = await api.get(`tasks/${seg(key)}/attempts`);
      count.textContent = attempts.length
        ? `${attempts.length} kept, oldest first` : "";
      fill(list, attempts.length
        ? h("ol", { class: "timeline" }, attempts.map(entry))
        : h("p", { class: "muted empty" }, "No attempt yet."));
    } catch (err) {
      fill(list, h("p", { class: "error" }, `Could not load the attempts: ${err.message}`));
    }
  }

  load();
  return h("section", { class: "panel", id: "attempts" },
    h("div", { class: "panel-head" }, h("h2", {}, "Attempts ", count),
      h("button", { type: "button", class: "secondary", id: "attempts-refresh", onclick: load },
        "Refresh")),
    list);
}
