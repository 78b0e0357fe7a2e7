// Dead letters: tasks that failed for good (GET /tasks?status=failed, newest first), replayed
// one at a time or as a selection (POST /tasks/{key}/replay each).

import { api, seg } from "./api.js";
import { h, needs, notify, table, time, fill } from "./dom.js";

export function render(root) {
  const results = h("div", { id: "dead-results" });
  const replaySelected = needs("write", h("button", { type: "button", id: "replay-selected",
    disabled: true, onclick: () => replay([...selected]) }, "Replay selected"));
  const selectAll = h("input", { type: "checkbox", id: "select-all",
    onchange: () => {
      for (const task of rows) {
        if (selectAll.checked) selected.add(task.key); else selected.delete(task.key);
      }
      draw();
    } });
  // Its name is shown only on a narrow screen, where the header row is out of sight but this;
  // elsewhere the label's title says it on hover. (A title on the box itself would be read as
  // its description, after the same name.)
  const selectAllHeader = needs("write", h("label", { class: "select-all", title: "Select all" },
    selectAll, h("span", { class: "stacked-only" }, "Select all")));
  root.append(
    h("h1", {}, "Dead letters"),
    h("p", { class: "muted" }, "Tasks that failed for good, newest first. Replay schedules " +
      "one again, now, with its attempts reset."),
    h("div", { class: "toolbar selection" }, replaySelected,
      h("button", { type: "button", class: "secondary", onclick: () => load() }, "Refresh")),
    results);

  let rows = [];
  let cursor = null;
  const selected = new Set();

  async function replay(keys) {
    replaySelected.disabled = true;
    const done = [];
    const failed = [];
    // One call per task: the API replays tasks one by one. Sequential keeps the load gentle.
    for (const key of keys) {
      try {
        await api.post(`tasks/${seg(key)}/replay`);
        done.push(key);
      } catch (err) {
        failed.push(`${key} (${err.message})`);
      }
    }
    for (const key of done) selected.delete(key);
    if (failed.length) notify(`Replayed ${done.length}; not replayed: ${failed.join(", ")}`, "error");
    else notify(`Replayed ${done.length} task${done.length === 1 ? "" : "s"}: ${done.join(", ")}.`);
    await load();
  }

  function row(task) {
    const box = needs("write", h("input", { type: "checkbox", class: "pick",
      checked: selected.has(task.key), "aria-label": `select ${task.key}`,
      onchange: () => {
        if (box.checked) selected.add(task.key); else selected.delete(task.key);
        sync();
      } }));
    return h("tr", { "data-key": task.key },
      h("td", {}, box),
      h("td", {}, h("a", { href: `#/task/${seg(task.key)}`, class: "key" }, task.key)),
      h("td", {}, time(task.finished_at)),
      h("td", { class: "num" }, `${task.attempts} / ${task.max_attempts}`),
      h("td", { class: "num" }, task.last_status_code ?? "—"),
      h("td", { class: "clip", title: task.last_error || "" }, task.last_error || "—"),
      h("td", {}, needs("write", h("button", { type: "button", class: "secondary replay",
        onclick: () => replay([task.key]) }, "Replay"))));
  }

  function sync() {
    replaySelected.disabled = selected.size === 0;
    replaySelected.textContent = selected.size ? `Replay selected (${selected.size})` : "Replay selected";
    selectAll.checked = rows.length > 0 && rows.every((t) => selected.has(t.key));
  }

  function draw() {
    fill(results,
      table([selectAllHeader, "Key", "Failed at", "Attempts", "Last status", "Last error", ""],
        rows.map(row), { empty: "No dead letters.", pick: 0, title: 1 }),
      cursor ? h("button", { type: "button", class: "secondary", id: "more",
        onclick: () => load(cursor) }, "Load more") : null);
    sync();
  }

  async function load(after = null) {
    try {
      const page = await api.get("tasks", { status: "failed", limit: 100, cursor: after });
      rows = after ? rows.concat(page.tasks) : page.tasks;
      cursor = page.next_cursor;
      const shown = new Set(rows.map((t) => t.key));
      for (const key of [...selected]) if (!shown.has(key)) selected.delete(key);
      draw();
    } catch (err) {
      fill(results, h("p", { class: "error" }, `Could not list dead letters: ${err.message}`));
    }
  }

  load();
}
