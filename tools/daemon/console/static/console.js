// The macula console: one EventSource for the live feed, DOM built with textContent only
// (everything an agent wrote is untrusted text), writes as same-origin JSON POSTs.
"use strict";

const state = { snapshot: null, room: null, tab: "rooms" };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else if (key === "onclick") node.addEventListener("click", value);
    else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
  }
  return node;
}

function short(hex) { return hex ? hex.slice(0, 12) + "…" : ""; }
function when(ms) { return ms ? new Date(ms).toLocaleTimeString() : ""; }
function fill(id, nodes) { document.getElementById(id).replaceChildren(...nodes); }

async function post(path, body) {
  const response = await fetch(path, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
    credentials: "same-origin",
  });
  let data = {};
  try { data = await response.json(); } catch (e) { data = { ok: 0, detail: response.statusText }; }
  return data;
}

// The names a person gave (MACULA_MCP_AGENT, the operator name) beside a petname, when known.
function givenNames(nodeId) {
  const names = (state.snapshot && state.snapshot.names && state.snapshot.names[nodeId]) || {};
  const parts = [names.agent_name, names.operator_name].filter((n) => n);
  return [...new Set(parts)].join(" · ");
}

function label(nodeId, petname) {
  const given = givenNames(nodeId);
  return (petname || short(nodeId)) + (given ? " (" + given + ")" : "");
}

function nameTag(nodeId, petname) {
  const given = givenNames(nodeId);
  return el("span", { class: "name", "data-node": nodeId }, el("span", { class: "who" }, petname || short(nodeId)),
    given ? el("span", { class: "given" }, given) : null);
}

function hostedName(nodeId) {
  const names = (state.snapshot && state.snapshot.names && state.snapshot.names[nodeId]) || {};
  return names.agent_name || "";
}

function roomPurpose(room) { return room.purpose || "(no purpose given)"; }
function people(room) { return room.participants.map((p) => label(p.node_id, p.petname)).join(", "); }
function realmOf(room) { return /^0+$/.test(room.realm) ? null : room.realm; }

function renderRooms(snapshot) {
  const rooms = snapshot.rooms;
  if (!state.room || !rooms.some((r) => r.room_topic === state.room)) state.room = rooms.length ? rooms[0].room_topic : null;
  fill("room-list", rooms.map((r) => el("li", {
    class: r.room_topic === state.room ? "on" : "",
    "data-room": r.room_topic,
    "data-hosts": r.hosts.map((h) => h.petname).join(" "),
    title: r.room_topic,
    onclick: () => { state.room = r.room_topic; render(); },
  },
  el("div", { class: "purpose" }, roomPurpose(r)),
  el("div", { class: "people" }, people(r)),
  el("div", { class: "hosts" }, "hosted here: ", ...r.hosts.map((h) => el("span", { class: "tag host", "data-host": h.node_id }, label(h.node_id, h.petname))),
    r.private ? el("span", { class: "tag" }, "private") : null,
    realmOf(r) ? el("span", { class: "tag" }, "realm " + short(r.realm)) : null,
    r.unread ? el("span", { class: "badge", "data-unread": r.unread }, r.unread) : null))));
  const chosen = rooms.find((r) => r.room_topic === state.room);
  document.getElementById("say-form").hidden = !chosen;
  if (!chosen) {
    document.getElementById("room-title").textContent = "no room yet";
    document.getElementById("room-people").textContent = "";
    document.getElementById("room-meta").textContent = "";
    fill("transcript", []);
    return;
  }
  document.getElementById("room-title").textContent = roomPurpose(chosen);
  document.getElementById("room-people").textContent = "with " + people(chosen);
  fill("room-meta", [el("span", {}, "seen here by " + chosen.hosts.map((h) => h.petname).join(" and ") +
    (chosen.private ? " · private, decrypted here" : "") + (realmOf(chosen) ? " · realm " + chosen.realm : "") + " · "),
  el("code", { class: "topic", title: "the room's topic" }, chosen.room_topic)]);
  const as = document.getElementById("say-as");
  const was = as.value;
  as.replaceChildren(...chosen.hosts.map((h) => el("option", { value: h.node_id }, "as " + label(h.node_id, h.petname))));
  if (chosen.hosts.some((h) => h.node_id === was)) as.value = was;
  as.hidden = chosen.hosts.length < 2;
  const hosted = new Set(chosen.hosts.map((h) => h.node_id));
  fill("transcript", chosen.messages.map((m) => el("li", {
    class: "msg" + (m.from_person ? " person" : "") + (hosted.has(m.from) ? " mine" : ""),
    "data-message": m.message_id,
    "data-from-person": m.from_person,
    "data-depth": Math.min(m.depth || 0, 6),
  },
  el("span", { class: "who" }, label(m.from, m.from_petname) + (m.from_person ? " (person)" : "")),
  el("span", { class: "kind" }, m.kind),
  el("span", { class: "when" }, when(m.sent_at)),
  m.attested ? null : el("span", { class: "tag warn" }, "unattested"),
  el("div", { class: "text" }, m.text || ""))));
}

function renderRings(snapshot) {
  const items = [];
  for (const identity of snapshot.identities) {
    for (const ring of identity.rings) {
      const answer = (value) => async () => {
        status("ring-status", await post("/api/ring", { node_id: identity.node_id, ring_id: ring.ring_id, answer: value }));
      };
      items.push(el("li", { "data-ring": ring.ring_id },
        nameTag(ring.peer, ring.peer_petname), " rings ", nameTag(identity.node_id, identity.petname),
        el("span", { class: "purpose" }, ring.purpose || ""),
        el("button", { class: "accept", onclick: answer(1) }, "Accept"),
        el("button", { class: "decline", onclick: answer(2) }, "Decline")));
    }
  }
  document.getElementById("rings-count").textContent = items.length || "";
  fill("ring-list", items.length ? items : [el("li", { class: "meta" }, "no ring is waiting")]);
}

function renderTasks(snapshot) {
  const rows = [];
  for (const identity of snapshot.identities) {
    for (const task of identity.tasks) {
      const result = task.result === null || task.result === undefined ? (task.error || "") : JSON.stringify(task.result);
      rows.push(el("tr", { "data-task": task.task_id },
        el("td", {}, label(identity.node_id, identity.petname)), el("td", {}, task.role), el("td", {}, task.a2a_agent ? "A2A " + task.a2a_agent : label(task.peer, task.peer_petname)),
        el("td", {}, task.title), el("td", { class: "state" }, task.state), el("td", {}, result)));
    }
  }
  fill("task-rows", rows);
  const select = document.getElementById("task-from");
  const chosen = select.value;
  select.replaceChildren(...snapshot.identities.map((i) => el("option", { value: i.node_id }, label(i.node_id, i.petname))));
  if (chosen) select.value = chosen;
}

function renderPresent(snapshot) {
  const seen = new Map();
  for (const identity of snapshot.identities) {
    if (typeof identity.directory === "string") continue;
    for (const row of identity.directory) if (!seen.has(row.node_id)) seen.set(row.node_id, row);
  }
  fill("present-rows", [...seen.values()].map((row) => el("tr", { "data-agent": row.node_id },
    el("td", {}, (row.petname || short(row.node_id)) + (hostedName(row.node_id) ? " (" + hostedName(row.node_id) + ")" : "")),
    el("td", {}, row.operator_name || ""),
    el("td", {}, row.model || ""), el("td", {}, row.station ? short(row.station) : ""),
    el("td", {}, row.source || ""))));
}

function renderRealms(snapshot) {
  const members = [];
  for (const identity of snapshot.identities) {
    for (const realm of identity.realms) {
      members.push(el("li", {}, el("span", { class: "who" }, identity.petname), " is ", realm.role,
        " of ", el("b", {}, realm.name), el("span", { class: "meta" }, " until " + new Date(realm.valid_until).toLocaleDateString())));
    }
  }
  fill("membership-list", members.length ? members : [el("li", { class: "meta" }, "no membership")]);
  const joins = [];
  for (const realm of snapshot.owned_realms) {
    for (const join of realm.pending) {
      const decide = (approve) => async () => {
        status("realm-status", await post("/api/realm", { realm: realm.name, code: join.code, approve }));
      };
      joins.push(el("li", { "data-join": join.code },
        el("b", {}, realm.name), " ← ", el("span", { class: "who" }, join.petname), " code ", el("code", {}, join.code),
        el("button", { class: "approve", onclick: decide(1) }, "Approve"),
        el("button", { class: "deny", onclick: decide(0) }, "Deny")));
    }
  }
  document.getElementById("joins-count").textContent = joins.length || "";
  fill("join-list", joins.length ? joins : [el("li", { class: "meta" }, "no join request is waiting")]);
}

function renderIdentities(snapshot) {
  fill("identity-list", snapshot.identities.map((i) => el("li", { "data-identity": i.node_id },
    nameTag(i.node_id, i.petname), " ", el("code", {}, short(i.node_id)), i.present ? " · present" : " · not present",
    el("div", { class: "meta" }, "agent name: " + (i.agent_name || "none (set MACULA_MCP_AGENT)") + " · operator: " + (i.operator_name || "none (set MACULA_MCP_OPERATOR_NAME)")),
    el("div", { class: "meta" }, "stations: " + i.stations.join(", ")),
    el("div", { class: "meta" }, "contact policy: " + i.policy.contact_policy + (i.policy.policy_error ? " (" + i.policy.policy_error + ")" : "")),
    el("div", { class: "meta" }, "trusted: " + (i.policy.trusted.map((t) => t.petname).join(", ") || "nobody")))));
  document.getElementById("person").textContent = "you: " + snapshot.person.petname;
}

function render() {
  const snapshot = state.snapshot;
  if (!snapshot) return;
  renderRooms(snapshot);
  renderRings(snapshot);
  renderTasks(snapshot);
  renderPresent(snapshot);
  renderRealms(snapshot);
  renderIdentities(snapshot);
}

// A failure is said under the form until the next try; a success says nothing: what it did shows
// in the page itself (the message in the transcript, the ring or join gone, the task's row).
function status(id, result) {
  const node = document.getElementById(id);
  node.textContent = result.ok ? "" : (result.code || "error") + ": " + (result.detail || "");
  node.dataset.ok = result.ok ? "1" : "0";
}

function showTab(name) {
  state.tab = name;
  for (const button of document.querySelectorAll("#tabs button")) button.classList.toggle("on", button.dataset.tab === name);
  for (const section of document.querySelectorAll("section.tab")) section.classList.toggle("on", section.id === name);
}

function connect() {
  const feed = document.getElementById("feed");
  const source = new EventSource("/events");
  source.addEventListener("snapshot", (event) => {
    state.snapshot = JSON.parse(event.data);
    feed.textContent = "live";
    feed.dataset.state = "live";
    render();
  });
  source.addEventListener("error", () => { feed.textContent = "reconnecting…"; feed.dataset.state = "down"; });
}

document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("#tabs button")) button.addEventListener("click", () => showTab(button.dataset.tab));
  document.getElementById("say-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const chosen = state.snapshot && state.snapshot.rooms.find((r) => r.room_topic === state.room);
    const input = document.getElementById("say-text");
    if (!chosen || !input.value.trim()) return;
    const as = document.getElementById("say-as").value || chosen.hosts[0].node_id;
    const result = await post("/api/say", {
      node_id: as, room_topic: chosen.room_topic,
      kind: document.getElementById("say-kind").value, text: input.value,
    });
    if (result.ok) input.value = "";
    status("say-status", result);
  });
  document.getElementById("task-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = (id) => document.getElementById(id).value;
    const result = await post("/api/task", { node_id: value("task-from"), to: value("task-to"), title: value("task-title"), input: value("task-input") });
    status("task-status", result);
  });
  connect();
});
