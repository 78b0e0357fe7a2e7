// Tasks: list and search by status and key prefix (GET /tasks), a task's details with its last
// attempt's outcome (GET /tasks/{key}), cancel (DELETE) and replay (POST .../replay).

import { api, seg } from "./api.js";
import { attemptsPanel } from "./attempts.js";
import { badge, confirmButton, h, localTime, needs, notify, table, time, fill } from "./dom.js";

const STATUSES = ["scheduled", "retrying", "delivering", "failed", "succeeded", "cancelled"];
const OPEN = new Set(["scheduled", "retrying", "delivering", "waiting"]);
const LIMITS = [25, 50, 100, 500];

function lastResult(task) {
  if (task.last_status_code !== null) return `HTTP ${task.last_status_code}`;
  if (task.last_error) return task.last_error;
  return "—";
}

async function cancel(key) {
  await api.del(`tasks/${seg(key)}`);
  notify(`Cancelled ${key}.`);
}

async function replay(key) {
  const view = await api.post(`tasks/${seg(key)}/replay`);
  notify(`Replayed ${key}: ${view.status}, due ${localTime(view.execute_at)}.`);
}

// Runs `action`; an error becomes the page's notice instead of an unhandled rejection.
export async function attempt(action, after) {
  try {
    await action();
  } catch (err) {
    notify(err.message, "error");
  }
  if (after) await after();
}

export function taskActions(task, after) {
  const actions = [];
  if (OPEN.has(task.status)) {
    actions.push(confirmButton("Cancel", `Cancel ${task.key}?`,
      () => attempt(() => cancel(task.key), after)));
  }
  if (task.status === "failed" || task.status === "cancelled") {
    actions.push(h("button", { type: "button", class: "secondary",
      onclick: () => attempt(() => replay(task.key), after) }, "Replay"));
  }
  return needs("write", h("span", { class: "row-actions" }, actions));
}

export function render(root, params) {
  const status = params.get("status") || "scheduled";
  const prefix = params.get("prefix") || "";
  const limit = Number(params.get("limit")) || 50;

  const statusSelect = h("select", { id: "status", name: "status" },
    STATUSES.map((s) => h("option", { value: s, selected: s === status }, s)));
  const prefixInput = h("input", { id: "prefix", name: "prefix", type: "search", value: prefix,
    placeholder: "key prefix", spellcheck: false, autocomplete: "off" });
  const limitSelect = h("select", { id: "limit", name: "limit" },
    LIMITS.map((n) => h("option", { value: String(n), selected: n === limit }, String(n))));
  const keyInput = h("input", { id: "open-key", type: "text", placeholder: "exact task key",
    spellcheck: false, autocomplete: "off" });
  const results = h("div", { id: "task-results" });

  const search = h("form", { class: "toolbar", id: "task-search", onsubmit: (event) => {
    event.preventDefault();
    const query = new URLSearchParams({ status: statusSelect.value, limit: limitSelect.value });
    if (prefixInput.value.trim()) query.set("prefix", prefixInput.value.trim());
    const target = `#/tasks?${query}`;
    if (window.location.hash === target) load(); else window.location.hash = target;
  } },
  h("label", {}, "Status ", statusSelect),
  h("label", {}, "Key starts with ", prefixInput),
  h("label", {}, "Show ", limitSelect),
  h("button", { type: "submit" }, "Search"));

  const open = h("form", { class: "toolbar", id: "task-open", onsubmit: (event) => {
    event.preventDefault();
    if (keyInput.value.trim()) window.location.hash = `#/task/${seg(keyInput.value.trim())}`;
  } }, h("label", {}, "Open a task ", keyInput), h("button", { type: "submit", class: "secondary" }, "Open"));

  root.append(h("h1", {}, "Tasks"), search, open, results);

  let rows = [];
  let cursor = null;

  function row(task) {
    return h("tr", { "data-key": task.key },
      h("td", {}, h("a", { href: `#/task/${seg(task.key)}`, class: "key" }, task.key)),
      h("td", {}, badge(task.status)),
      h("td", {}, time(task.execute_at)),
      h("td", {}, time(task.next_attempt_at)),
      h("td", { class: "num" }, `${task.attempts} / ${task.max_attempts}`),
      h("td", { class: "clip", title: task.last_error || "" }, lastResult(task)),
      h("td", {}, taskActions(task, load)));
  }

  function draw() {
    const more = cursor ? h("button", { type: "button", class: "secondary", id: "more",
      onclick: () => load(cursor) }, "Load more") : null;
    fill(results,
      h("p", { class: "muted", id: "task-count" },
        `${rows.length} ${status} task${rows.length === 1 ? "" : "s"}` +
        (prefix ? ` with keys starting “${prefix}”` : "") + (cursor ? " so far" : "")),
      table(["Key", "Status", "Execute at", "Next attempt", "Attempts", "Last result", ""],
        rows.map(row), { empty: "No task matches.", aside: 1 }),
      more);
  }

  async function load(after = null) {
    try {
      const page = await api.get("tasks", { status, key_prefix: prefix, limit, cursor: after });
      rows = after ? rows.concat(page.tasks) : page.tasks;
      cursor = page.next_cursor;
      draw();
    } catch (err) {
      fill(results, h("p", { class: "error" }, `Could not list tasks: ${err.message}`));
    }
  }

  load();
}

// A task's body as sent: JSON pretty-printed, a string (own Content-Type) as is.
function bodyOf(body) {
  if (body === null || body === undefined) return h("span", { class: "muted" }, "none");
  const text = typeof body === "string" ? body : JSON.stringify(body, null, 2);
  return h("pre", { class: "body", id: "task-body" }, text);
}

export function renderTask(root, key) {
  const body = h("div", { id: "task-detail" }, h("p", { class: "muted" }, "Loading…"));
  root.append(h("p", {}, h("a", { href: "#/tasks" }, "← Tasks")), h("h1", { class: "key" }, key), body);

  function field(name, value) {
    return [h("dt", {}, name), h("dd", {}, value)];
  }

  function outcome(task) {
    if (!task.last_attempt_at) return "No attempt yet.";
    const code = task.last_status_code;
    const what = code !== null ? `answered HTTP ${code}` : `failed: ${task.last_error || "unknown"}`;
    const then = {
      succeeded: "the task succeeded",
      failed: "the task failed for good and is in the dead letters",
      retrying: `it will be retried at ${localTime(task.next_attempt_at)}`,
      delivering: "an attempt is in flight",
      cancelled: "the task was cancelled",
      scheduled: "the task was scheduled again",
    }[task.status] || task.status;
    return `Attempt ${task.attempts} ${what}; ${then}.`;
  }

  // What each attempt sends besides the callback line: headers, body, timeout, backoff, flow.
  // Absent from a service older than API v3: then the section is left out.
  function request(task) {
    if (task.headers === undefined) return null;
    const headers = Object.entries(task.headers || {});
    return h("section", { class: "panel", id: "task-request" }, h("h2", {}, "Request"),
      h("dl", {},
        field("Callback", h("span", { class: "url" }, `${task.method} ${task.callback_url}`)),
        field("Headers", headers.length ? h("table", { class: "headers", id: "task-headers" },
          h("tbody", {}, headers.map(([name, value]) =>
            h("tr", {}, h("th", {}, name), h("td", {}, value))))) : "none"),
        field("Body", bodyOf(task.body)),
        field("Timeout", task.timeout != null ? `${task.timeout} s per attempt` : "—"),
        field("Retry backoff", task.retry_backoff != null ?
          `${task.retry_backoff} s before the first retry, doubling each time` : "—"),
        field("Flow", task.flow_key ? h("a", { href: "#/flows", id: "task-flow" }, task.flow_key) : "—"),
        resultField(task, "on_success", "succeeded", "delivered"),
        resultField(task, "on_failure", "failed", "fails for good")));
  }

  // A result callback (API v3): its URL, and once the task has ended that way, a link to the
  // result task {key}.on_success / {key}.on_failure that posts the outcome there; once it has
  // ended another way (or was cancelled), that it is not posted; while it is open, that it
  // will be.
  function resultField(task, kind, status, when) {
    const url = task[kind];
    if (!url) return null;
    const resultKey = `${task.key}.${kind}`;
    const ended = { succeeded: "the task succeeded", failed: "the task failed",
      cancelled: "the task was cancelled" }[task.status];
    let link;
    if (task.status === status) {
      link = h("a", { href: `#/task/${seg(resultKey)}`, class: "key", id: `task-${kind.replace("_", "-")}` }, resultKey);
    } else if (ended) {
      link = h("span", { class: "muted" }, `not posted: ${ended}`);
    } else {
      link = h("span", { class: "muted" }, `posted by the task ${resultKey} once it ${when}`);
    }
    return field(kind === "on_success" ? "On success" : "On failure",
      h("span", {}, h("span", { class: "url" }, `POST ${url}`), " — ", link));
  }

  // The task a result callback reports on, for a result task's page.
  function parentLink() {
    const match = /^(.+)\.(on_success|on_failure)$/.exec(key);
    if (!match) return null;
    return h("p", { id: "task-parent" }, "Reports the outcome of ",
      h("a", { href: `#/task/${seg(match[1])}`, class: "key" }, match[1]), ".");
  }

  async function load() {
    try {
      const task = await api.get(`tasks/${seg(key)}`);
      fill(body,
        h("p", {}, badge(task.status), " ", taskActions(task, load)),
        parentLink(),
        h("section", { class: "panel" }, h("h2", {}, "Last attempt"),
          h("p", { id: "last-outcome" }, outcome(task)),
          h("dl", {},
            field("At", time(task.last_attempt_at)),
            field("Status code", task.last_status_code ?? "—"),
            field("Error", task.last_error || "—"))),
        h("section", { class: "panel" }, h("h2", {}, "Task"),
          h("dl", {},
            // With the request section below, the callback line is shown there.
            task.headers === undefined ? field("Callback", `${task.method} ${task.callback_url}`) : null,
            field("Execute at", time(task.execute_at)),
            field("Next attempt", time(task.next_attempt_at)),
            field("Attempts", `${task.attempts} of ${task.max_attempts}`),
            field("Created", time(task.created_at)),
            field("Finished", time(task.finished_at)))),
        request(task));
    } catch (err) {
      fill(body, h("p", { class: "error" }, `Could not load the task: ${err.message}`));
    }
  }

  load();
  root.append(attemptsPanel(key)); // the history, under the task's details (attempts.js)
}
