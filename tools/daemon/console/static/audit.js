// The console's Audit tab: the hosted agents' audit trails (GET /api/audit), newest entries first,
// with whether each chain verifies. Read-only; text set with textContent only. Uses el() and
// state from console.js (loaded first).
"use strict";

function auditFacts(facts) {
  return Object.entries(facts || {}).map(([key, value]) => key + "=" + String(value).slice(0, 24)).join(" ");
}

function renderAudit(data) {
  fill("audit-trails", data.trails.map((trail) => {
    const verdict = trail.recorded
      ? (trail.verified.intact ? "chain intact · " + trail.verified.checkpoints + " checkpoints"
        : "chain broken: " + trail.verified.problem + ": " + trail.verified.detail)
      : "no trail (MACULA_MCP_NO_AUDIT=1)";
    const rows = trail.entries.map((entry) => el("tr", { "data-kind": entry.kind },
      el("td", {}, entry.seq), el("td", {}, when(entry.at_ms)), el("td", {}, entry.kind),
      el("td", {}, entry.outcome), el("td", { class: "meta" }, auditFacts(entry.facts))));
    return el("div", { "data-identity": trail.node_id },
      el("h3", {}, trail.petname + " ", el("code", {}, short(trail.node_id))),
      el("p", { class: "meta", "data-verified": trail.recorded && trail.verified.intact ? "1" : "0" }, verdict),
      el("table", {}, el("thead", {}, el("tr", {}, ...["seq", "time", "kind", "outcome", "facts"].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...rows)));
  }));
}

async function loadAudit() {
  const response = await fetch("/api/audit", { credentials: "same-origin" });
  if (response.ok) renderAudit(await response.json());
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelector('#tabs button[data-tab="audit"]').addEventListener("click", loadAudit);
  document.getElementById("audit-refresh").addEventListener("click", loadAudit);
  setInterval(() => { if (state.tab === "audit") loadAudit(); }, 5000);
});
