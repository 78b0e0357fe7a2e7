// Flows: the flows with something set (GET /flows), their load, whether they are paused and
// their retry defaults; limits edited (PUT /flows/{key}, keeping the pause and the retry
// defaults), paused or resumed (POST /flows/{key}/pause, /resume), or dropped back to the
// defaults (DELETE).

import { api, seg } from "./api.js";
import { confirmButton, h, needs, notify, table, fill } from "./dom.js";
import { attempt } from "./page-tasks.js";

const REFRESH_MS = 5000;

// "" means no limit of that kind (null); anything else must be a number.
function limitValue(input, integer) {
  const text = input.value.trim();
  if (!text) return null;
  const value = Number(text);
  if (!Number.isFinite(value) || (integer && !Number.isInteger(value))) {
    throw new Error(`${input.name}: “${text}” is not a${integer ? "n integer" : " number"}`);
  }
  return value;
}

// PUT replaces the whole configuration: what the form does not edit is sent as it is now.
function kept(flow) {
  if (!flow) return {};
  return { paused: flow.paused, max_attempts: flow.max_attempts ?? null,
    retry_backoff: flow.retry_backoff ?? null, max_backoff: flow.max_backoff ?? null };
}

// "20 × 30 s, ≤ 3600 s": the flow's retry defaults, "—" when it has none.
function retries(flow) {
  const parts = [];
  if (flow.max_attempts != null) parts.push(`${flow.max_attempts} attempts`);
  // "\u00a0": "≤", a number and its unit on the same line, where the cell wraps (a phone).
  if (flow.retry_backoff != null) parts.push(`from ${flow.retry_backoff}\u00a0s`);
  if (flow.max_backoff != null) parts.push(`≤\u00a0${flow.max_backoff}\u00a0s`);
  return parts.length ? parts.join(", ") : "—";
}

async function save(key, parallelismInput, rateInput, current) {
  const body = { ...kept(current), parallelism: limitValue(parallelismInput, true),
    rate: limitValue(rateInput, false) };
  const view = await api.put(`flows/${seg(key)}`, body);
  notify(`Flow ${view.key}: parallelism ${view.parallelism ?? "none"}, ` +
    `rate ${view.rate ?? "none"}/s${view.paused ? "; still paused" : ""}.`);
}

export function render(root) {
  let alive = true;
  let editing = null; // the key whose row is open for editing: no refresh under the user's hands
  // What the user typed in that row: a save refused (422, or not a number) draws the row again
  // with it, to be corrected, not with the flow's values over it.
  let draft = null;
  let flows = [];
  const results = h("div", { id: "flow-results" });

  const keyInput = h("input", { id: "flow-key", name: "flow key", placeholder: "api.example.com:443",
    spellcheck: false, autocomplete: "off", required: true });
  const newParallelism = h("input", { id: "flow-parallelism", name: "parallelism",
    inputmode: "numeric", placeholder: "default", size: 8 });
  const newRate = h("input", { id: "flow-rate", name: "rate", inputmode: "decimal",
    placeholder: "none", size: 8 });
  // Flows are admin's (docs/api.md v3, "Scoped tokens"): the form and the row actions need it.
  const form = needs("admin", h("form", { class: "toolbar", id: "flow-form", onsubmit: (event) => {
    event.preventDefault();
    const key = keyInput.value.trim();
    attempt(() => save(key, newParallelism, newRate, flows.find((f) => f.key === key)), load);
  } },
  h("label", {}, "Flow ", keyInput),
  h("label", {}, "Parallelism ", newParallelism),
  h("label", {}, "Rate /s ", newRate),
  h("button", { type: "submit" }, "Set limits")));

  root.append(
    h("h1", {}, "Flows"),
    h("p", { class: "muted" }, "Flows with limits, a pause or retry defaults set. Every other " +
      "flow (by default, each destination host:port) runs on the defaults. In flight and " +
      "waiting (due tasks held back by the flow: its limits or a pause) count every process."),
    form, results);

  function row(flow) {
    if (editing === flow.key) {
      if (!draft) {
        draft = { parallelism: flow.parallelism === null ? "" : String(flow.parallelism),
          rate: flow.rate === null ? "" : String(flow.rate) };
      }
      const typed = draft;
      const parallelism = h("input", { name: "parallelism", class: "edit-parallelism", size: 8,
        value: typed.parallelism, inputmode: "numeric", "aria-label": `parallelism of ${flow.key}`,
        oninput: () => { typed.parallelism = parallelism.value; } });
      const rate = h("input", { name: "rate", class: "edit-rate", size: 8,
        value: typed.rate, inputmode: "decimal", "aria-label": `rate per second of ${flow.key}`,
        oninput: () => { typed.rate = rate.value; } });
      return h("tr", { "data-key": flow.key, class: "editing" },
        h("td", { class: "key" }, flow.key),
        h("td", {}, parallelism), h("td", {}, rate),
        h("td", { class: "num" }, flow.in_flight), h("td", { class: "num" }, flow.waiting),
        h("td", {}, state(flow)), h("td", { class: "retries" }, retries(flow)),
        h("td", {}, h("span", { class: "row-actions" },
          h("button", { type: "button", class: "save", onclick: () => {
            attempt(async () => {
              await save(flow.key, parallelism, rate, flow);
              editing = null;
              draft = null;
            }, load);
          } }, "Save"),
          h("button", { type: "button", class: "secondary", onclick: () => {
            editing = null;
            draft = null;
            draw();
          } }, "Cancel"))));
    }
    return h("tr", { "data-key": flow.key },
      h("td", { class: "key" }, flow.key),
      h("td", { class: "num parallelism" }, flow.parallelism ?? "—"),
      h("td", { class: "num rate" }, flow.rate ?? "—"),
      h("td", { class: "num" }, flow.in_flight),
      h("td", { class: "num waiting" }, flow.waiting),
      h("td", {}, state(flow)),
      h("td", { class: "retries" }, retries(flow)),
      h("td", {}, needs("admin", h("span", { class: "row-actions" },
        pauseButton(flow),
        h("button", { type: "button", class: "secondary edit", onclick: () => {
          editing = flow.key;
          draft = null; // from the flow's values
          draw();
        } }, "Edit"),
        confirmButton("Reset", `Back to the defaults?`, () => attempt(async () => {
          await api.del(`flows/${seg(flow.key)}`);
          notify(`Flow ${flow.key} is back on the defaults.`);
        }, load))))));
  }

  function state(flow) {
    if (!flow.paused) return h("span", { class: "muted state" }, "running");
    return h("span", { class: "badge badge-flow-paused state",
      title: "no attempt of this flow starts on any process until it is resumed" }, "paused");
  }

  // Pause: every process stops starting attempts of the flow (within a tick); its due tasks
  // wait. Resume: they start in due order, within the limits.
  function pauseButton(flow) {
    const verb = flow.paused ? "resume" : "pause";
    return h("button", { type: "button", class: flow.paused ? "resume" : "secondary pause",
      onclick: () => attempt(async () => {
        const view = await api.post(`flows/${seg(flow.key)}/${verb}`);
        notify(view.paused ? `Flow ${view.key} is paused: ${view.waiting} waiting.`
          : `Flow ${view.key} resumed.`);
      }, load) }, flow.paused ? "Resume" : "Pause");
  }

  function draw() {
    fill(results, table(["Flow", "Parallelism", "Rate /s", "In flight", "Waiting", "State",
      "Retry defaults", ""], flows.map(row),
    { empty: "No flow has anything set.", aside: 5 }));
  }

  // A refresh in the background does not redraw under the user's hands either: one already
  // on its way when the user opened an edit or a "Reset?" question only keeps its data.
  const busy = () => editing !== null || results.querySelector(".confirm .question") !== null;

  async function load({ background = false } = {}) {
    try {
      const list = await api.get("flows", undefined, { background });
      if (!alive) return;
      flows = list.flows;
      if (background && busy()) return;
      draw();
    } catch (err) {
      if (alive) fill(results, h("p", { class: "error" }, `Could not list flows: ${err.message}`));
    }
  }

  load();
  // No refresh under the user's hands: not while a row is edited, nor while a "Reset?" question
  // waits for its answer (a redraw would take the question away before the click).
  const timer = window.setInterval(() => {
    if (!busy()) load({ background: true });
  }, REFRESH_MS);
  return () => {
    alive = false;
    window.clearInterval(timer);
  };
}
