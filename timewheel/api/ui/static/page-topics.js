// Topics: every topic (GET /topics), and one topic's endpoints and recent publishes
// (GET /topics/{name}); each publish links to its tasks, <key>.<endpoint>.

import { api, seg } from "./api.js";
import { fill, h, table, time } from "./dom.js";

function taskLink(key) {
  return h("a", { class: "key", href: `#/task/${encodeURIComponent(key)}` }, key);
}

export function render(root) {
  const results = h("div", { id: "topic-results" });
  root.append(
    h("h1", {}, "Topics"),
    h("p", { class: "muted" }, "A publish to a topic makes one task per endpoint, key " +
      "<publish key>.<endpoint>, all at once or none."),
    h("div", { class: "toolbar" },
      h("button", { type: "button", class: "secondary", onclick: () => load() }, "Refresh")),
    results);

  let rows = [];
  let cursor = null;

  function row(topic) {
    return h("tr", { "data-name": topic.name },
      h("td", {}, h("a", { class: "key", href: `#/topic/${encodeURIComponent(topic.name)}` },
        topic.name)),
      h("td", { class: "clip", title: topic.endpoints.map((e) => e.name).join(", ") },
        `${topic.endpoints.length}: ${topic.endpoints.map((e) => e.name).join(", ")}`),
      h("td", {}, time(topic.updated_at)));
  }

  function draw() {
    fill(results,
      table(["Topic", "Endpoints", "Updated"], rows.map(row), { empty: "No topics." }),
      cursor ? h("button", { type: "button", class: "secondary", id: "more",
        onclick: () => load(cursor) }, "Load more") : null);
  }

  async function load(after = null) {
    try {
      const page = await api.get("topics", { limit: 100, cursor: after });
      rows = after ? rows.concat(page.topics) : page.topics;
      cursor = page.next_cursor;
      draw();
    } catch (err) {
      fill(results, h("p", { class: "error" }, `Could not list topics: ${err.message}`));
    }
  }

  load();
}

export function renderTopic(root, name) {
  const body = h("div", { id: "topic-detail" }, h("p", { class: "muted" }, "Loading…"));
  root.append(
    h("p", {}, h("a", { href: "#/topics" }, "← Topics")),
    h("h1", {}, "Topic ", h("span", { class: "key" }, name)),
    body);

  async function load() {
    let topic;
    try {
      topic = await api.get(`topics/${seg(name)}`);
    } catch (err) {
      fill(body, h("p", { class: "error" }, `Could not read topic ${name}: ${err.message}`));
      return;
    }
    const endpoints = table(["Endpoint", "URL", "Headers"], topic.endpoints.map((e) =>
      h("tr", { "data-endpoint": e.name },
        h("td", { class: "key" }, e.name),
        h("td", { class: "clip", title: e.url }, e.url),
        h("td", {}, Object.entries(e.headers).map(([k, v]) => `${k}: ${v}`).join("; ") || "—"))));
    const names = topic.endpoints.map((e) => e.name);
    const publishes = table(["Publish", "Published", "Tasks"], topic.recent_publishes.map((p) =>
      h("tr", { "data-publish": p.key },
        h("td", { class: "key" }, p.key),
        h("td", {}, time(p.published_at)),
        h("td", { class: "links" }, ...names.flatMap((n) => [taskLink(`${p.key}.${n}`), " "])))),
    { empty: "No publishes yet." });
    fill(body,
      h("p", { class: "muted" }, "Created ", time(topic.created_at), ", updated ",
        time(topic.updated_at), "."),
      h("h2", {}, `Endpoints (${topic.endpoints.length})`), endpoints,
      h("h2", { class: "section" }, "Recent publishes"),
      h("p", { class: "muted" }, "Newest first; the task links use today's endpoints (a " +
        "publish made before a change of the topic made the tasks of the endpoints it had)."),
      publishes);
  }

  load();
}
