// Schedules: every schedule with its next run (GET /schedules), paused and resumed
// (POST /schedules/{id}/pause, /resume).

import { api, seg } from "./api.js";
import { h, localTime, needs, notify, table, time, fill } from "./dom.js";
import { attempt } from "./page-tasks.js";

function when(schedule) {
  if (schedule.cron) return `cron ${schedule.cron} (${schedule.timezone})`;
  return `every ${schedule.every} s`;
}

export function render(root) {
  const results = h("div", { id: "schedule-results" });
  root.append(
    h("h1", {}, "Schedules"),
    h("p", { class: "muted" }, "Each occurrence becomes a task with key " +
      "<id>.<occurrence ms>. A paused schedule starts no occurrence until it is resumed."),
    h("div", { class: "toolbar" },
      h("button", { type: "button", class: "secondary", onclick: () => load() }, "Refresh")),
    results);

  let rows = [];
  let cursor = null;

  async function toggle(schedule) {
    const verb = schedule.paused ? "resume" : "pause";
    const view = await api.post(`schedules/${seg(schedule.id)}/${verb}`);
    notify(view.paused ? `Paused ${view.id}.` :
      `Resumed ${view.id}; next run ${localTime(view.next_run_at)}.`);
  }

  function row(schedule) {
    return h("tr", { "data-id": schedule.id },
      h("td", { class: "key" }, schedule.id),
      h("td", {}, when(schedule)),
      h("td", { class: "clip", title: `${schedule.task.method || "POST"} ${schedule.task.callback_url}` },
        `${schedule.task.method || "POST"} ${schedule.task.callback_url}`),
      h("td", {}, h("span", { class: `badge badge-${schedule.paused ? "paused" : "active"}` },
        schedule.paused ? "paused" : "active")),
      h("td", { class: "next-run" }, time(schedule.next_run_at)),
      h("td", {}, time(schedule.last_run_at)),
      h("td", {}, h("span", { class: "row-actions" },
        needs("write", h("button", { type: "button", class: schedule.paused ? "" : "secondary",
          onclick: () => attempt(() => toggle(schedule), load) },
        schedule.paused ? "Resume" : "Pause")),
        h("a", { title: "its occurrences, as tasks", href: `#/tasks?status=scheduled&prefix=${encodeURIComponent(`${schedule.id}.`)}` },
          "tasks"))));
  }

  function draw() {
    fill(results,
      table(["Schedule", "When", "Callback", "State", "Next run", "Last run", ""],
        rows.map(row), { empty: "No schedules.", aside: 3 }),
      cursor ? h("button", { type: "button", class: "secondary", id: "more",
        onclick: () => load(cursor) }, "Load more") : null);
  }

  async function load(after = null) {
    try {
      const page = await api.get("schedules", { limit: 100, cursor: after });
      rows = after ? rows.concat(page.schedules) : page.schedules;
      cursor = page.next_cursor;
      draw();
    } catch (err) {
      fill(results, h("p", { class: "error" }, `Could not list schedules: ${err.message}`));
    }
  }

  load();
}
