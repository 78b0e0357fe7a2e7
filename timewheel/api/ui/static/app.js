// The dashboard's shell: hash routes to pages, the token dialog, the Redis health light.
// Pages render into <main> and may return a cleanup function (timers) run when they are left.

import {
  BASE, fetchScope, getToken, onScopeRefused, onTokenNeeded, onTokenRefused, onTokenWorked,
  setToken,
} from "./api.js";
import { clearNotice } from "./dom.js";
import * as dead from "./page-dead.js";
import * as flows from "./page-flows.js";
import * as overview from "./page-overview.js";
import * as schedules from "./page-schedules.js";
import * as tasks from "./page-tasks.js";
import * as topics from "./page-topics.js";
import { browserZone, setZoneMode, zoneMode } from "./zone.js";

const HEALTH_MS = 10000;

const PAGES = {
  overview: (root) => overview.render(root),
  tasks: (root, params) => tasks.render(root, params),
  task: (root, params, arg) => tasks.renderTask(root, arg),
  "dead-letters": (root) => dead.render(root),
  flows: (root) => flows.render(root),
  schedules: (root) => schedules.render(root),
  topics: (root) => topics.render(root),
  topic: (root, params, arg) => topics.renderTopic(root, arg),
};

let cleanup = null;
let scope = null; // the token's scope (GET /auth), null while unknown
let accepted = null; // the token GET /auth answered that scope for: the header's ✓ is for it
let known = null; // the last token GET /auth accepted, kept when it is refused later

// <body class="can-write can-admin">: style.css shows what needs a scope only to a token that
// has it (dom.js, needs()).
function applyScope(value) {
  scope = value;
  document.body.classList.toggle("can-write", scope === "write" || scope === "admin");
  document.body.classList.toggle("can-admin", scope === "admin");
  document.body.dataset.scope = scope || "";
  document.getElementById("token-button").dispatchEvent(new Event("scope"));
}

async function refreshScope() {
  const value = await fetchScope();
  accepted = value === null ? null : getToken();
  if (accepted !== null) {
    known = accepted;
    document.getElementById("token-lost").hidden = true;
  }
  applyScope(value);
}

// "#/tasks?status=failed" -> ["tasks", URLSearchParams, undefined]; "#/task/k" -> ["task", .., "k"]
function parseHash() {
  const hash = window.location.hash.replace(/^#\/?/, "");
  const [path, query] = hash.split("?", 2);
  const [page, ...rest] = path.split("/");
  const arg = rest.length ? decodeURIComponent(rest.join("/")) : undefined;
  return [PAGES[page] ? page : "overview", new URLSearchParams(query || ""), arg];
}

function route() {
  if (cleanup) cleanup();
  cleanup = null;
  clearNotice();
  const [page, params, arg] = parseHash();
  const nav = { task: "tasks", topic: "topics" }[page] || page;
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.page === nav);
  }
  const root = document.getElementById("view");
  root.replaceChildren();
  document.title = `timewheel · ${nav.replace("-", " ")}`;
  const result = PAGES[page](root, params, arg);
  if (typeof result === "function") cleanup = result;
}

function tokenDialog() {
  const dialog = document.getElementById("token-dialog");
  const input = document.getElementById("token-input");
  const reason = document.getElementById("token-reason");
  const defaultReason = reason.textContent;
  const button = document.getElementById("token-button");
  let settle = null;

  function refreshButton() {
    // ✓ only for a token the service accepted (GET /auth), not for one merely entered: a
    // refused token, the dialog cancelled, is no token. A token that may not do everything
    // says so (an admin token, the usual one, says nothing).
    const token = getToken();
    const ok = token !== "" && token === accepted && scope !== null;
    const shown = { read: " (read only)", write: " (write)" }[scope] || "";
    button.textContent = ok ? `Token ✓${shown}` : "Token";
    button.title = token && !ok ? "This token was not accepted (yet)" :
      scope ? `This token's scope: ${scope}` : "";
  }

  function close(saved) {
    if (dialog.open) dialog.close();
    refreshButton();
    if (settle) settle(saved);
    settle = null;
  }

  function open(message) {
    reason.textContent = message || defaultReason;
    input.value = getToken();
    if (!dialog.open) dialog.showModal();
    input.focus();
  }

  // Asked for by a call that got a 401 (api.js): it waits for the answer, and tries again
  // with a saved token itself.
  function ask(message) {
    open(message);
    return new Promise((resolve) => {
      settle = resolve;
    });
  }

  document.getElementById("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    setToken(input.value);
    const waiting = settle !== null;
    close(true);
    // opened from the header: learn the new token's scope, then draw the page again with it
    if (!waiting) refreshScope().then(route);
    else refreshScope();
  });
  document.getElementById("token-forget").addEventListener("click", () => {
    setToken("");
    input.value = "";
    close(false);
    applyScope(null); // no token: asking /auth now would only bring the dialog back
  });
  document.getElementById("token-cancel").addEventListener("click", () => close(false));
  dialog.addEventListener("cancel", () => close(false)); // Escape
  button.addEventListener("click", () => open());
  button.addEventListener("scope", refreshButton);
  refreshButton();
  onTokenNeeded(ask);
  // The service refused the token (it had accepted it: rotated, removed): no ✓ for it any
  // more, and a line under the header says so, with a button to enter another. A page's
  // refresh in the background does not open the dialog by itself (api.js): this line is
  // where the user learns why the page stopped updating.
  const lost = document.getElementById("token-lost");
  const lostText = document.getElementById("token-lost-text");
  const lostButton = document.getElementById("token-lost-button");
  let lostReason = "";
  onTokenRefused((token) => {
    if (token === accepted) {
      accepted = null;
      refreshButton();
    }
    if (token && token === known) {
      lostText.textContent = "The token is no longer accepted: the service answers 401 to it.";
      lostButton.textContent = "Enter a new token";
      lostReason = "The token is no longer accepted; enter another.";
    } else if (token) {
      lostText.textContent = "The token was not accepted: the service answers 401 to it.";
      lostButton.textContent = "Enter another token";
      lostReason = "The token was refused; enter another.";
    } else {
      lostText.textContent = "This service needs an API token: its calls are answered 401.";
      lostButton.textContent = "Enter a token";
      lostReason = "This service needs an API token.";
    }
    lost.hidden = false;
  });
  lostButton.addEventListener("click", () => open(lostReason));
  // A call answered 2xx since (the service took the token back, or dropped its tokens): the
  // line goes, and the header learns the token's scope again.
  onTokenWorked(() => {
    if (lost.hidden) return;
    lost.hidden = true;
    refreshScope();
  });
  // A 403: the token may do less than the page thought (its scope lowered): learn it again,
  // so the header says it and the buttons it may not use go.
  onScopeRefused(() => refreshScope());
}

async function health() {
  const light = document.getElementById("health");
  try {
    const response = await fetch(new URL("healthz", BASE), { cache: "no-store" });
    const ok = response.ok;
    light.textContent = ok ? "Redis ok" : "Redis unavailable";
    light.className = `health ${ok ? "health-ok" : "health-bad"}`;
  } catch {
    light.textContent = "service unreachable";
    light.className = "health health-bad";
  }
}

// The header's time zone toggle: UTC (the API's zone) or the browser's; the page is drawn again.
function zoneToggle() {
  const button = document.getElementById("zone-button");
  const show = () => {
    button.textContent = zoneMode() === "utc" ? "Times: UTC" : `Times: ${browserZone()}`;
  };
  button.addEventListener("click", () => {
    setZoneMode(zoneMode() === "utc" ? "local" : "utc");
    show();
    route();
  });
  show();
}

tokenDialog();
zoneToggle();
window.addEventListener("hashchange", route);
route();
refreshScope();
health();
window.setInterval(health, HEALTH_MS);
