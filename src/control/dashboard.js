"use strict";
// Everything here talks to the control API the CLI uses (docs/control-api.md);
// the session the login page kept in this origin's localStorage
// authenticates (X-Troupe-Session: no cookie, which the browser would send
// to every port of the host), and every state-changing request says
// X-Troupe-Csrf too.
let current = null;
let lastDrawn = -1;
const el = (id) => document.getElementById(id);
const session = () => localStorage.getItem("troupe_session") || "";

async function api(path, options) {
  const init = Object.assign({credentials: "omit"}, options || {});
  init.headers = Object.assign({"X-Troupe-Session": session()}, init.headers || {});
  if (init.method && init.method !== "GET") {
    init.headers = Object.assign({"Content-Type": "application/json", "X-Troupe-Csrf": "1"}, init.headers);
  }
  const r = await fetch(path, init);
  const body = await r.json().catch(() => ({}));
  if (!r.ok) {
    const e = body.error || {};
    throw new Error((e.code || r.status) + ": " + (e.message || "refused"));
  }
  return body;
}

function text(tag, content, cls) {
  const node = document.createElement(tag);
  node.textContent = content;
  if (cls) node.className = cls;
  return node;
}

async function refreshRuns() {
  const {runs} = await api("/v1/runs");
  const body = el("runs").querySelector("tbody");
  body.replaceChildren();
  for (const run of runs.slice().reverse()) {
    const row = document.createElement("tr");
    row.dataset.run = run.runId;
    const link = text("a", run.runId.slice(0, 13));
    link.onclick = () => openRun(run.runId);
    const first = document.createElement("td");
    first.appendChild(link);
    row.appendChild(first);
    row.appendChild(text("td", run.pipeline));
    row.appendChild(text("td", run.status, "status-" + run.status));
    const x = run.executions || {};
    for (const n of [x.running, x.ok, x.failed, x.cancelled, run.pending + run.questions]) {
      row.appendChild(text("td", String(n || 0), "n"));
    }
    body.appendChild(row);
  }
}

function openRun(id) {
  current = id;
  lastDrawn = -1;
  location.hash = id;
  el("runs-view").hidden = true;
  el("run-view").hidden = false;
  el("run-id").textContent = id;
  el("timeline").replaceChildren();
  refreshRun();
}

function closeRun() {
  current = null;
  location.hash = "";
  el("run-view").hidden = true;
  el("runs-view").hidden = false;
}

async function refreshRun() {
  if (!current) return;
  const id = current;
  const run = await api("/v1/runs/" + id);
  el("run-status").textContent = run.status;
  el("run-status").className = "status-" + run.status;
  for (const k of ["running", "ok", "failed", "cancelled"]) {
    el("c-" + k).textContent = String(run.executions[k]);
  }
  el("c-seq").textContent = String(run.lastSeq);
  el("failure").hidden = !run.reason;
  el("failure").textContent = run.reason ? "failed: " + run.reason : "";
  const over = ["ok", "failed", "cancelled"].includes(run.status);
  el("cancel").disabled = over;
  await refreshPending(id);
  await refreshQuestions(id);
  if (run.lastSeq !== lastDrawn) {
    lastDrawn = run.lastSeq;
    const r = await fetch("/v1/runs/" + id + "/timeline.svg", {credentials: "omit", headers: {"X-Troupe-Session": session()}});
    if (r.ok) el("timeline").innerHTML = await r.text();
  }
}

async function refreshPending(id) {
  const {pending} = await api("/v1/runs/" + id + "/pending");
  const box = el("pending");
  const open = new Set(pending.map((p) => p.proposalId));
  for (const card of Array.from(box.querySelectorAll(".card"))) {
    if (!open.has(card.dataset.proposal)) card.remove();
  }
  for (const p of pending) {
    if (box.querySelector('[data-proposal="' + CSS.escape(p.proposalId) + '"]')) continue;
    const card = document.createElement("div");
    card.className = "card";
    card.dataset.proposal = p.proposalId;
    card.appendChild(text("div", p.stageExecutionId + " wants " + p.tool));
    card.appendChild(text("pre", p.argsSummary));
    for (const [label, answer] of [["Approve", "approve"], ["Deny", "deny"]]) {
      const b = text("button", label);
      b.className = answer;
      b.onclick = async () => {
        try {
          await api("/v1/runs/" + id + "/pending/" + encodeURIComponent(p.proposalId),
            {method: "POST", body: JSON.stringify({answer, client: "dashboard"})});
          card.remove();
        } catch (e) { card.appendChild(text("div", e.message, "err")); }
      };
      card.appendChild(b);
    }
    box.appendChild(card);
  }
  const none = box.querySelector("p");
  if (none) none.hidden = pending.length > 0;
}

// A form from the step's `fields` (a JSON Schema object): a text box per
// string, a number box per number, a checkbox per boolean, a list per enum.
function form(q, id) {
  const f = document.createElement("form");
  f.className = "card";
  f.dataset.execution = q.stageExecutionId;
  f.appendChild(text("div", q.prompt));
  const props = (q.fields && q.fields.properties) || {};
  for (const [name, schema] of Object.entries(props)) {
    const label = text("label", name + " ");
    let input;
    if (Array.isArray(schema.enum)) {
      input = document.createElement("select");
      for (const v of schema.enum) input.appendChild(text("option", String(v)));
    } else {
      input = document.createElement("input");
      input.type = schema.type === "boolean" ? "checkbox"
        : (schema.type === "number" || schema.type === "integer") ? "number" : "text";
    }
    input.name = name;
    input.dataset.type = schema.type || "string";
    label.appendChild(input);
    f.appendChild(label);
  }
  const send = text("button", "Answer");
  send.type = "submit";
  f.appendChild(send);
  const msg = text("div", "", "err");
  f.appendChild(msg);
  f.onsubmit = async (event) => {
    event.preventDefault();
    const answer = {};
    for (const input of f.querySelectorAll("input, select")) {
      const t = input.dataset.type;
      if (input.type === "checkbox") answer[input.name] = input.checked;
      else if (input.value === "") continue;
      else if (t === "integer") answer[input.name] = parseInt(input.value, 10);
      else if (t === "number") answer[input.name] = Number(input.value);
      else answer[input.name] = input.value;
    }
    try {
      await api("/v1/runs/" + id + "/questions/" + encodeURIComponent(q.stageExecutionId) + "?client=dashboard",
        {method: "POST", body: JSON.stringify(answer)});
      f.remove();
    } catch (e) { msg.textContent = e.message; }
  };
  return f;
}

async function refreshQuestions(id) {
  const {questions} = await api("/v1/runs/" + id + "/questions");
  const box = el("questions");
  const open = new Set(questions.map((q) => q.stageExecutionId));
  for (const f of Array.from(box.querySelectorAll("form"))) {
    if (!open.has(f.dataset.execution)) f.remove();
  }
  for (const q of questions) {
    if (box.querySelector('[data-execution="' + CSS.escape(q.stageExecutionId) + '"]')) continue;
    box.appendChild(form(q, id));
  }
  const none = box.querySelector("p");
  if (none) none.hidden = questions.length > 0;
}

el("back").onclick = closeRun;
el("cancel").onclick = async () => {
  try {
    await api("/v1/runs/" + current + "/cancel", {method: "POST", body: "null"});
    el("cancel-msg").textContent = "cancelling";
  } catch (e) { el("cancel-msg").textContent = e.message; }
};

async function tick() {
  try {
    if (current) await refreshRun(); else await refreshRuns();
  } catch (e) {
    console.warn(e);
  }
  setTimeout(tick, 500);
}
if (location.hash.length > 1) openRun(location.hash.slice(1));
tick();
