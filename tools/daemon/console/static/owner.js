// The owner's capability switches (owner.toml): shown per group, flipped with one click, a
// preset chosen for the home or for one agent. Same-origin JSON POSTs to /api/owner; the page
// never builds HTML from text (textContent only).
"use strict";

const owner = { agent: "" };

function ownerEl(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else if (key === "onclick") node.addEventListener("click", value);
    else node[key] = value;
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function ownerStatus(result) {
  const node = document.getElementById("owner-status");
  node.textContent = result.ok ? "" : (result.code || "error") + ": " + (result.detail || "");
  node.dataset.ok = result.ok ? "1" : "0";
}

async function ownerPost(body) {
  if (owner.agent) body.agent = owner.agent;
  const response = await fetch("/api/owner", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify(body), credentials: "same-origin",
  });
  let data = {};
  try { data = await response.json(); } catch (e) { data = { ok: 0, detail: response.statusText }; }
  ownerStatus(data);
  if (data.ok) renderOwner(data);
}

function renderOwner(data) {
  const switches = data.switches;
  document.getElementById("owner-file").textContent = data.file + (data.exists ? "" : " (absent: preset full)");
  const problem = document.getElementById("owner-problem");
  problem.textContent = switches.problem
    ? "Malformed: " + switches.problem.file + " line " + switches.problem.line + ", key " + (switches.problem.key || "?") + ": " + switches.problem.message + ". Every switchable tool is off until the file is fixed (by hand)."
    : "";
  const pick = document.getElementById("owner-agent");
  const known = ["", ...data.agents];
  if (owner.agent && !known.includes(owner.agent)) known.push(owner.agent);
  pick.replaceChildren(...known.map((name) => ownerEl("option", { value: name, selected: name === owner.agent }, name || "(the home: every agent)")));
  const presets = data.presets.map((name) => ownerEl("button", {
    class: name === switches.preset ? "on" : "", "data-preset": name,
    onclick: () => ownerPost({ preset: name }),
  }, name));
  document.getElementById("owner-presets").replaceChildren(...presets);
  const rows = [];
  for (const [group, tools] of Object.entries(data.groups)) {
    const on = tools.filter((tool) => switches.on.includes(tool)).length;
    rows.push(ownerEl("tr", { class: "group" },
      ownerEl("th", {}, group + " (" + on + "/" + tools.length + " on)"),
      ownerEl("td", {}, ownerEl("button", { "data-switch": group, onclick: () => ownerPost({ name: group, value: 1 }) }, "all on"),
        ownerEl("button", { "data-switch": group, onclick: () => ownerPost({ name: group, value: 0 }) }, "all off")),
      ownerEl("td", {}, "")));
    for (const tool of tools) {
      const isOn = switches.on.includes(tool);
      rows.push(ownerEl("tr", {},
        ownerEl("td", {}, tool),
        ownerEl("td", {}, ownerEl("button", {
          class: isOn ? "on" : "", "data-switch": tool,
          onclick: () => ownerPost({ name: tool, value: isOn ? 0 : 1 }),
        }, isOn ? "on" : "off")),
        ownerEl("td", { class: "meta" }, switches.decided_by[tool] || "")));
    }
  }
  document.getElementById("owner-rows").replaceChildren(...rows);
}

async function loadOwner() {
  const query = owner.agent ? "?agent=" + encodeURIComponent(owner.agent) : "";
  const response = await fetch("/api/owner" + query, { credentials: "same-origin" });
  const data = await response.json();
  if (data.ok) renderOwner(data); else ownerStatus(data);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("owner-agent").addEventListener("change", (event) => { owner.agent = event.target.value; loadOwner(); });
  document.getElementById("owner-agent-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("owner-agent-name");
    owner.agent = input.value.trim();
    input.value = "";
    loadOwner();
  });
  const tab = document.querySelector('#tabs button[data-tab="owner"]');
  if (tab) tab.addEventListener("click", loadOwner);
  loadOwner();
});
