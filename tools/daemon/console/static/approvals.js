// The owner's approval queue in the console (issue 39): what waits, WITH its content (this is
// the owner's screen, never the model's), approved or denied in one click. DOM built with
// textContent only: the content is untrusted text from a peer. Polls /api/approvals each
// second (decisions made by the CLI show too) and after each decision.
"use strict";

(() => {
  function node(tag, attrs, ...children) {
    const made = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") made.className = value;
      else if (key.startsWith("data-")) made.setAttribute(key, value);
      else if (key === "onclick") made.addEventListener("click", value);
      else made[key] = value;
    }
    for (const child of children) {
      if (child !== null && child !== undefined) made.append(typeof child === "object" ? child : String(child));
    }
    return made;
  }

  async function decide(item, decision) {
    const status = document.getElementById("approval-status");
    const response = await fetch("/api/approvals/decide", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ approval_id: item.approval_id, decision: decision }),
      credentials: "same-origin",
    });
    let result = {};
    try { result = await response.json(); } catch (e) { result = { ok: 0, detail: response.statusText }; }
    status.textContent = result.ok ? item.approval_id + " " + result.state : (result.code || "error") + ": " + (result.detail || "");
    status.dataset.ok = result.ok ? "1" : "0";
    await refresh();
  }

  function row(item) {
    const who = item.petname || item.sender.slice(0, 12) + "…";
    const content = JSON.stringify(item.content, null, 2);
    return node("li", { "data-approval": item.approval_id, "data-kind": item.kind },
      node("span", { class: "tag" }, item.kind),
      node("span", { class: "who" }, who),
      node("span", { class: "meta" }, item.size + " B · " + item.age_s + " s ago · expires in " + item.expires_in_s + " s · " + item.approval_id),
      node("pre", { class: "approval-content" }, content),
      node("button", { class: "approve", onclick: () => decide(item, "approve") }, "Approve"),
      node("button", { class: "deny", onclick: () => decide(item, "deny") }, "Deny"));
  }

  async function refresh() {
    let data = { approvals: [] };
    try {
      const response = await fetch("/api/approvals", { credentials: "same-origin" });
      if (!response.ok) return;
      data = await response.json();
    } catch (e) { return; }
    const items = data.approvals || [];
    document.getElementById("approval-list").replaceChildren(...items.map(row));
    document.getElementById("approvals-count").textContent = items.length ? String(items.length) : "";
    document.getElementById("approvals-empty").hidden = items.length > 0;
  }

  document.addEventListener("DOMContentLoaded", () => {
    refresh();
    setInterval(refresh, 1000);
  });
})();
