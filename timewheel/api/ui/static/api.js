// The public API as the dashboard calls it: fetch with the bearer token (when one was entered),
// JSON in and out, and a token prompt when the service answers 401 to what the user did.

const TOKEN_KEY = "timewheel.token";

// The page is served at <base>ui, so the API lives at <base> (also behind a proxy prefix).
export const BASE = new URL(".", window.location.href);

export class ApiError extends Error {
  constructor(status, detail) {
    super(describe(status, detail));
    this.status = status;
    this.detail = detail;
  }
}

function describe(status, detail) {
  if (typeof detail === "string") return `${status}: ${detail}`;
  if (Array.isArray(detail)) {
    // FastAPI's validation errors: [{"loc": [...], "msg": "..."}]
    return `${status}: ` + detail.map((e) => `${(e.loc || []).slice(1).join(".")} ${e.msg}`)
      .join("; ");
  }
  return `${status}: ${detail ? JSON.stringify(detail) : "request failed"}`;
}

export function getToken() {
  return window.sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(token) {
  const trimmed = token.trim();
  if (trimmed) window.sessionStorage.setItem(TOKEN_KEY, trimmed);
  else window.sessionStorage.removeItem(TOKEN_KEY);
}

// What the token may do: "read", "write" or "admin" (GET /auth; "admin" when the service has no
// tokens set), or null while unknown (no token, or it was refused): then nothing that needs
// write or admin is shown.
export async function fetchScope() {
  try {
    return (await request("GET", "auth")).scope;
  } catch {
    return null;
  }
}

// Set by app.js: shows the token dialog and resolves true when a token was saved, false when
// the user cancelled. Concurrent 401s share one prompt.
let prompter = async () => false;
let pending = null;
let answered = 0; // prompts the user answered (saved or cancelled) so far

export function onTokenNeeded(fn) {
  prompter = fn;
}

function askForToken(reason) {
  if (!pending) {
    pending = prompter(reason).finally(() => {
      answered += 1;
      pending = null;
    });
  }
  return pending;
}

// Set by app.js: told when the service refused the token that is saved (a 401 with it, or
// without one: ""), so the header no longer shows it as accepted and the page says so.
let refused = () => {};

export function onTokenRefused(fn) {
  refused = fn;
}

// Set by app.js: told when a call was answered 2xx: the token it carried works (again).
let worked = () => {};

export function onTokenWorked(fn) {
  worked = fn;
}

// Set by app.js: told when the token may not do what was asked (403): its scope is learned
// again, since it may have been lowered since the page learned it.
let forbidden = () => {};

export function onScopeRefused(fn) {
  forbidden = fn;
}

// One call: request(method, path, {query, body, background}). Resolves to the parsed JSON
// (null for 204), throws ApiError otherwise. A 401 asks for a token and tries again while the
// user gives one. A background call (a page's refresh every 5 s) never opens the dialog: the
// user did nothing, and a token that stopped working would bring it back every 5 s; it fails
// with its 401 (app.js shows a line with a button to enter a token), or waits for a dialog
// already open.
export async function request(method, path, { query, body, background = false } = {}) {
  const url = new URL(path, BASE);
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, value);
  }
  for (;;) {
    const headers = { Accept: "application/json" };
    const token = getToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    const init = { method, headers, cache: "no-store" };
    const asked = answered;
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(url, init);
    } catch (err) {
      throw new ApiError(0, `the service did not answer (${err.message})`);
    }
    if (response.status === 401) {
      // A token saved while this call was on its way (another call's prompt): try it before
      // asking again, or a call answered late would open the dialog a second time.
      if (getToken() !== token) continue;
      refused(token);
      // The user answered the dialog while this call was on its way (Cancel, or the same
      // token again): that answer was this call's too, not a reason to open it once more.
      const reason = token ? "The token was refused; enter another." :
        "This service needs an API token.";
      const ask = answered === asked && (!background || pending !== null);
      if (ask && await askForToken(reason)) continue;
    }
    if (response.status === 403) forbidden();
    if (response.status === 204) {
      worked(token);
      return null;
    }
    let payload = null;
    const text = await response.text();
    if (text) {
      try {
        payload = JSON.parse(text);
      } catch {
        payload = text;
      }
    }
    if (!response.ok) {
      const detail = payload && typeof payload === "object" && "detail" in payload ?
        payload.detail : payload;
      throw new ApiError(response.status, detail);
    }
    worked(token);
    return payload;
  }
}

export const api = {
  get: (path, query, { background = false } = {}) => request("GET", path, { query, background }),
  put: (path, body) => request("PUT", path, { body }),
  post: (path, body) => request("POST", path, { body }),
  del: (path) => request("DELETE", path),
};

// Path segments (task keys, flow keys, schedule ids) are restricted by the API to characters
// that need no escaping, but escape them anyway: the input may be anything a user typed.
export function seg(value) {
  return encodeURIComponent(value);
}
