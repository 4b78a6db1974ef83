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

function roomPurpose(room) {
  const opened = room.messages.find((m) => m.kind === "room_opened");
  return room.purpose || (opened && (opened.purpose || opened.text)) || "(no purpose)";
}

function roomKey(identity, room) { return identity.node_id + "/" + room.room_topic; }

function allRooms(snapshot) {
  const rooms = [];
  for (const identity of snapshot.identities) {
    for (const room of identity.rooms) rooms.push({ identity, room, key: roomKey(identity, room) });
  }
  return rooms;
}

function renderRooms(snapshot) {
  const rooms = allRooms(snapshot);
  if (!state.room || !rooms.some((r) => r.key === state.room)) state.room = rooms.length ? rooms[0].key : null;
  fill("room-list", rooms.map((r) => el("li", {
    class: r.key === state.room ? "on" : "",
    "data-room": r.room.room_topic,
    "data-agent": r.identity.petname,
    onclick: () => { state.room = r.key; render(); },
  },
  el("div", { class: "purpose" }, roomPurpose(r.room)),
  el("span", { class: "who" }, r.identity.petname),
  el("span", { class: "topic" }, short(r.room.room_topic.replace("agents.room.", ""))),
  r.room.private ? el("span", { class: "tag" }, "private") : null,
  /^0+$/.test(r.room.realm) ? null : el("span", { class: "tag" }, "realm " + short(r.room.realm)),
  r.room.unread ? el("span", { class: "badge", "data-unread": r.room.unread }, r.room.unread) : null)));
  const chosen = rooms.find((r) => r.key === state.room);
  document.getElementById("say-form").hidden = !chosen;
  if (!chosen) {
    document.getElementById("room-title").textContent = "no room yet";
    fill("transcript", []);
    return;
  }
  document.getElementById("room-title").textContent = chosen.room.room_topic;
  document.getElementById("room-meta").textContent =
    "seen by " + chosen.identity.petname + (chosen.room.private ? " · private, decrypted here" : "") +
    (/^0+$/.test(chosen.room.realm) ? "" : " · realm " + chosen.room.realm);
  fill("transcript", chosen.room.messages.map((m) => el("li", {
    class: "msg" + (m.from_person ? " person" : "") + (m.from === chosen.identity.node_id ? " mine" : ""),
    "data-message": m.message_id,
    "data-from-person": m.from_person,
    "data-depth": Math.min(m.depth || 0, 6),
  },
  el("span", { class: "who" }, (m.from_petname || short(m.from)) + (m.from_person ? " (person)" : "")),
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
        const done = await post("/api/ring", { node_id: identity.node_id, ring_id: ring.ring_id, answer: value });
        status("say-status", done);
      };
      items.push(el("li", { "data-ring": ring.ring_id },
        el("span", { class: "who" }, ring.peer_petname), " rings ", el("span", { class: "who" }, identity.petname),
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
        el("td", {}, identity.petname), el("td", {}, task.role), el("td", {}, task.peer_petname),
        el("td", {}, task.title), el("td", { class: "state" }, task.state), el("td", {}, result)));
    }
  }
  fill("task-rows", rows);
  const select = document.getElementById("task-from");
  const chosen = select.value;
  select.replaceChildren(...snapshot.identities.map((i) => el("option", { value: i.node_id }, i.petname)));
  if (chosen) select.value = chosen;
}

function renderPresent(snapshot) {
  const seen = new Map();
  for (const identity of snapshot.identities) {
    if (typeof identity.directory === "string") continue;
    for (const row of identity.directory) if (!seen.has(row.node_id)) seen.set(row.node_id, row);
  }
  fill("present-rows", [...seen.values()].map((row) => el("tr", { "data-agent": row.node_id },
    el("td", {}, row.petname || short(row.node_id)), el("td", {}, row.operator_name || ""),
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
        status("say-status", await post("/api/realm", { realm: realm.name, code: join.code, approve }));
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
    el("b", {}, i.petname), " ", el("code", {}, short(i.node_id)), i.present ? " · present" : " · not present",
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

function status(id, result) {
  const node = document.getElementById(id);
  node.textContent = result.ok ? "done" : (result.code || "error") + ": " + (result.detail || "");
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
    const chosen = allRooms(state.snapshot).find((r) => r.key === state.room);
    const input = document.getElementById("say-text");
    if (!chosen || !input.value.trim()) return;
    const result = await post("/api/say", {
      node_id: chosen.identity.node_id, room_topic: chosen.room.room_topic,
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
