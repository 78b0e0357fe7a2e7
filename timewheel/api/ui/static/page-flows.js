// Flows: the flows with limits set (GET /flows), their load, and their limits edited
// (PUT /flows/{key}) or dropped back to the defaults (DELETE).

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

async function save(key, parallelismInput, rateInput) {
  const body = { parallelism: limitValue(parallelismInput, true), rate: limitValue(rateInput, false) };
  const view = await api.put(`flows/${seg(key)}`, body);
  notify(`Flow ${view.key}: parallelism ${view.parallelism ?? "none"}, rate ${view.rate ?? "none"}/s.`);
}

export function render(root) {
  let alive = true;
  let editing = null; // the key whose row is open for editing: no refresh under the user's hands
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
    attempt(() => save(keyInput.value.trim(), newParallelism, newRate), load);
  } },
  h("label", {}, "Flow ", keyInput),
  h("label", {}, "Parallelism ", newParallelism),
  h("label", {}, "Rate /s ", newRate),
  h("button", { type: "submit" }, "Set limits")));

  root.append(
    h("h1", {}, "Flows"),
    h("p", { class: "muted" }, "Flows with limits set. Every other flow (by default, each " +
      "destination host:port) runs on the defaults. In flight and waiting count every process."),
    form, results);

  function row(flow) {
    if (editing === flow.key) {
      const parallelism = h("input", { name: "parallelism", class: "edit-parallelism", size: 8,
        value: flow.parallelism === null ? "" : String(flow.parallelism), inputmode: "numeric" });
      const rate = h("input", { name: "rate", class: "edit-rate", size: 8,
        value: flow.rate === null ? "" : String(flow.rate), inputmode: "decimal" });
      return h("tr", { "data-key": flow.key, class: "editing" },
        h("td", { class: "key" }, flow.key),
        h("td", {}, parallelism), h("td", {}, rate),
        h("td", { class: "num" }, flow.in_flight), h("td", { class: "num" }, flow.waiting),
        h("td", {}, h("span", { class: "row-actions" },
          h("button", { type: "button", class: "save", onclick: () => {
            attempt(async () => {
              await save(flow.key, parallelism, rate);
              editing = null;
            }, load);
          } }, "Save"),
          h("button", { type: "button", class: "secondary", onclick: () => {
            editing = null;
            draw();
          } }, "Cancel"))));
    }
    return h("tr", { "data-key": flow.key },
      h("td", { class: "key" }, flow.key),
      h("td", { class: "num parallelism" }, flow.parallelism ?? "—"),
      h("td", { class: "num rate" }, flow.rate ?? "—"),
      h("td", { class: "num" }, flow.in_flight),
      h("td", { class: "num" }, flow.waiting),
      h("td", {}, needs("admin", h("span", { class: "row-actions" },
        h("button", { type: "button", class: "secondary edit", onclick: () => {
          editing = flow.key;
          draw();
        } }, "Edit"),
        confirmButton("Reset", `Back to the defaults?`, () => attempt(async () => {
          await api.del(`flows/${seg(flow.key)}`);
          notify(`Flow ${flow.key} is back on the defaults.`);
        }, load))))));
  }

  function draw() {
    fill(results, table(["Flow", "Parallelism", "Rate /s", "In flight", "Waiting", ""],
      flows.map(row), { empty: "No flow has limits set." }));
  }

  async function load() {
    try {
      const list = await api.get("flows");
      if (!alive) return;
      flows = list.flows;
      draw();
    } catch (err) {
      if (alive) fill(results, h("p", { class: "error" }, `Could not list flows: ${err.message}`));
    }
  }

  load();
  // No refresh under the user's hands: not while a row is edited, nor while a "Reset?" question
  // waits for its answer (a redraw would take the question away before the click).
  const timer = window.setInterval(() => {
    if (editing === null && !results.querySelector(".confirm .question")) load();
  }, REFRESH_MS);
  return () => {
    alive = false;
    window.clearInterval(timer);
  };
}
