// Small DOM helpers. Every value from the API goes in as text (textContent, attributes), never
// as HTML: a task key or an error message must not be able to run script next to the token.

import { fields, zoneLabel } from "./zone.js";

export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      node.addEventListener(name.slice(2), value);
    } else if (name === "class") {
      node.className = value;
    } else if (name in node && typeof value !== "string") {
      node[name] = value; // properties such as checked, disabled, value
    } else {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

// Like node.replaceChildren, but skipping null/false children (replaceChildren writes "null").
export function fill(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";

export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  append(node, children);
  return node;
}

const pad = (n, width = 2) => String(n).padStart(width, "0");

// "2026-11-22 11:00:00 UTC", or in the browser's zone with its name ("12:00:00 CET") when the
// header's toggle says local; the RFC 3339 UTC value goes in a title.
export function localTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  const f = fields(d);
  return `${f.year}-${pad(f.month)}-${pad(f.day)} ` +
    `${pad(f.hours)}:${pad(f.minutes)}:${pad(f.seconds)} ${zoneLabel(d)}`;
}

// "11:00" in the chosen zone, without its name (the caller shows it once, beside).
export function hhmm(date) {
  const f = fields(date);
  return `${pad(f.hours)}:${pad(f.minutes)}`;
}

// "in 4 min", "12 s ago": relative to the browser's clock, which is close enough to show.
export function relative(iso) {
  if (!iso) return "";
  const seconds = Math.round((new Date(iso).getTime() - Date.now()) / 1000);
  const size = Math.abs(seconds);
  let text;
  if (size < 60) text = `${size} s`;
  else if (size < 3600) text = `${Math.round(size / 60)} min`;
  else if (size < 172800) text = `${Math.round(size / 3600)} h`;
  else text = `${Math.round(size / 86400)} d`;
  return seconds >= 0 ? `in ${text}` : `${text} ago`;
}

export function time(iso) {
  if (!iso) return h("span", { class: "muted" }, "—");
  return h("time", { datetime: iso, title: `${iso} (${relative(iso)})` }, localTime(iso));
}

export function badge(status) {
  return h("span", { class: `badge badge-${status}` }, status);
}

// On a phone (style.css; a tablet keeps the table, in narrower columns) every table shows each
// row as a block, so nothing scrolls sideways and every row's buttons are on the screen: its
// `title` cell (a key, a name) on top, with the `aside` cell (a status badge) beside it and the
// `pick` cell (a selection box) before it, then each other cell under it, named by its column
// (data-label), the buttons last. The header row is then out of sight, but its `pick` cell
// ("Select all").
// CSS that changes the display of a table's elements has taken their table semantics away
// (WebKit, older Chromium), so the table and its parts say their roles themselves: the same as
// their elements' own, right at any width.
export function table(headers, rows, { empty = "Nothing here.", title = 0, aside = null,
  pick = null } = {}) {
  if (!rows.length) return h("p", { class: "muted empty" }, empty);
  const kind = (i) => (i === pick ? "pick" : i === title ? "title" : i === aside ? "aside" : null);
  for (const row of rows) {
    row.setAttribute("role", "row");
    [...row.children].forEach((cell, i) => {
      cell.setAttribute("role", "cell");
      if (kind(i)) cell.dataset.stack = kind(i);
      else if (typeof headers[i] === "string" && headers[i]) cell.dataset.label = headers[i];
    });
  }
  // In a scrolling box: a table too wide all the same scrolls instead of clipping.
  return h("div", { class: "table-wrap" }, h("table", { class: "stack", role: "table" },
    h("thead", { role: "rowgroup" }, h("tr", { role: "row" }, headers.map((name, i) =>
      h("th", { role: "columnheader", "data-stack": kind(i) }, name)))),
    h("tbody", { role: "rowgroup" }, rows)));
}

// Marks an element as needing a token scope ("write" or "admin"): style.css hides it unless
// <body> says the token has that scope (app.js sets the classes from GET /auth). Hidden, not
// just disabled: a read-only dashboard on a team screen shows no buttons it cannot use. The API
// refuses such calls anyway (403); this only keeps them out of sight.
export function needs(scope, node) {
  node.dataset.needs = scope;
  return node;
}

// A button that asks once more before it acts: the first click shows "Yes" and "No".
export function confirmButton(label, question, action, { danger = true } = {}) {
  const wrap = h("span", { class: "confirm" });
  const first = h("button", { type: "button", class: "secondary", onclick: () => {
    wrap.replaceChildren(
      h("span", { class: "question" }, question, " "),
      h("button", { type: "button", class: danger ? "danger" : "", onclick: async (event) => {
        event.currentTarget.disabled = true;
        await action();
      } }, "Yes"),
      " ",
      h("button", { type: "button", class: "secondary", onclick: () => wrap.replaceChildren(first) },
        "No"));
  } }, label);
  wrap.append(first);
  return wrap;
}

let noticeTimer = null;

// A message under the header: kind "ok" fades after a while, "error" stays until the next one.
export function notify(message, kind = "ok") {
  const notice = document.getElementById("notice");
  notice.textContent = message;
  notice.className = `notice notice-${kind}`;
  notice.hidden = false;
  window.clearTimeout(noticeTimer);
  if (kind === "ok") noticeTimer = window.setTimeout(() => { notice.hidden = true; }, 6000);
}

export function clearNotice() {
  const notice = document.getElementById("notice");
  notice.hidden = true;
  window.clearTimeout(noticeTimer);
}
