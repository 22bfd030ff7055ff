"use strict";
// The Host console page: plain DOM, no framework, no network beyond this Host's own
// /console/api/v1. Live updates come from server-sent events; nothing here polls.

const API = "/console/api/v1";
const state = {
  operator: null,
  view: "hosts",
  session: null,
  run: null,
  events: null,
  live: null,
  samples: [],
  hosts: [],
  nextSessions: null,
  sessionsShown: 0,
  nextRuns: null,
  runsShown: 0,
  nextGates: null,
  gatesShown: 0,
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

async function call(method, path, body) {
  const init = { method, headers: { Accept: "application/json" }, credentials: "same-origin" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(API + path, init);
  const data = await r.json().catch(() => ({}));
  if (!r.ok) {
    const err = new Error((data.error && data.error.message) || r.statusText);
    err.code = data.error && data.error.code;
    err.status = r.status;
    throw err;
  }
  return data;
}

function status(text, isError) {
  const s = $("status");
  s.textContent = text || "";
  s.className = isError ? "error" : "muted";
}

function ago(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1000) return ms + " ms";
  return (ms / 1000).toFixed(1) + " s";
}

function time(ms) {
  return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) : "";
}

function table(id, headers, rows) {
  const t = $(id);
  t.replaceChildren(
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, rows.length ? rows : [el("tr", {}, el("td", { colspan: headers.length, class: "muted" }, "none"))]),
  );
}

function badge(text, kind) {
  return el("span", { class: "badge " + (kind || "") }, text);
}

const canOperate = () => state.operator && state.operator.role === "operate";

// ---------------------------------------------------------------- login

async function whoami() {
  try {
    const me = await call("GET", "/whoami");
    state.operator = me.operator;
    $("who").replaceChildren(
      `${me.operator.name} (${me.operator.role}) on ${me.host_id}`,
      el("button", { id: "logout", onclick: logout }, "Sign out"),
    );
    $("login").hidden = true;
    $("nav").hidden = false;
    follow();
    route();
  } catch (e) {
    if (e.status === 401) showLogin();
    else status(e.message, true);
  }
}

function showLogin() {
  state.operator = null;
  $("nav").hidden = true;
  $("who").replaceChildren();
  for (const v of document.querySelectorAll(".view")) v.hidden = true;
  $("login").hidden = false;
}

async function login(ev) {
  ev.preventDefault();
  $("login-error").textContent = "";
  try {
    await call("POST", "/login", { token: $("token").value });
    $("token").value = "";
    await whoami();
  } catch (e) {
    $("login-error").textContent = e.status === 401 ? "That token is not an operator credential." : e.message;
  }
}

async function logout() {
  await call("POST", "/logout", {}).catch(() => {});
  if (state.events) state.events.close();
  if (state.live) state.live.close();
  showLogin();
}

// ---------------------------------------------------------------- views

function route() {
  const v = (location.hash || "#hosts").slice(1).split("/")[0];
  state.view = ["hosts", "sessions", "gates", "runs", "charts"].includes(v) ? v : "hosts";
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === state.view);
  for (const s of document.querySelectorAll(".view")) s.hidden = s.id !== "view-" + state.view;
  refresh();
}

async function refresh() {
  if (!state.operator) return;
  try {
    if (state.view === "hosts") await showHosts();
    else if (state.view === "sessions") await showSessions();
    else if (state.view === "gates") await showGates();
    else if (state.view === "runs") await showRuns();
    else if (state.view === "charts") await showHostsChart();
    status("");
  } catch (e) {
    if (e.status === 401) showLogin();
    else status(e.message, true);
  }
}

async function showHosts() {
  const r = await call("GET", "/hosts");
  state.hosts = r.hosts;
  table("hosts-table", ["Host", "Generation", "Heartbeat age", "Capacity used/free", "State", "Sessions", "Ready"],
    r.hosts.map((h) => el("tr", { "data-host": h.host_id },
      el("td", {}, h.host_id, h.this ? " (this)" : ""),
      el("td", {}, h.generation),
      el("td", {}, ago(h.heartbeat_age_ms)),
      el("td", {}, `${h.used}/${h.free}`),
      el("td", {}, !h.live ? badge("expired", "bad") : h.draining ? badge("draining", "warn") : badge("accepting", "ok"),
        h.drain_requested_by ? el("span", { class: "muted", "data-drain-by": h.drain_requested_by }, ` asked by ${h.drain_requested_by}`) : ""),
      el("td", {}, h.sessions),
      el("td", { class: "wrap" }, h.this ? (h.ready ? badge("ready", "ok") : (h.reasons || []).map((x) => x.code).join(", ")) : ""),
    )));
  const area = $("drain-area");
  area.replaceChildren();
  const me = r.hosts.find((h) => h.this);
  if (canOperate() && me && me.accepting) {
    area.append(el("button", { id: "drain", class: "danger", onclick: drain }, `Drain ${r.host_id}`));
  }
}

async function drain() {
  if (!confirm("Drain this Host? Its sessions are given back and placed elsewhere.")) return;
  const b = $("drain");
  b.disabled = true;
  status("draining…");
  try {
    const report = await call("POST", "/drain", {});
    const pre = $("drain-report");
    pre.hidden = false;
    pre.textContent = JSON.stringify(report, null, 2);
    status(`drain ${report.state}: ${report.released.length} released, ${report.failures.length} failures`);
  } catch (e) {
    status(e.message, true);
  }
  await showHosts();
}

// Who did something, as the store recorded it; where it recorded nobody (a record written
// before it kept actors, or a caller that named nobody) the page says so, never a guess.
function actor(name) {
  return name ? name : badge("unknown", "muted");
}

function sessionRow(s) {
  return el("tr", { class: "clickable", "data-session": s.session_id, onclick: () => openSession(s.tenant_id, s.session_id) },
    el("td", {}, s.tenant_id),
    el("td", {}, s.session_id),
    el("td", {}, s.agent_id),
    el("td", {}, s.residency_state),
    el("td", {}, s.host_id || ""),
    el("td", {}, s.epoch === null ? "" : s.epoch),
    el("td", {}, s.gate_waiting ? badge(`${s.gates_open} open`, "warn") : ""),
    el("td", {}, s.command_blocked ? badge("blocked", "bad") : ""),
    el("td", {}, s.last_command ? `${s.last_command.kind} ${s.last_command.state}` : ""),
    el("td", {}, time(s.last_active_ms)),
  );
}

// How many rows a fresh read of a paged view asks for: as many as it shows (a live change
// must not fold up the pages the operator opened with More), at least a page, at most the
// API's bound.
const PAGE = 50;
const MAX_ROWS = 200; // the API's page bound (MAX_PAGE in console/src/api.rs)
const rowsToRead = (shown) => Math.min(MAX_ROWS, Math.max(PAGE, shown || 0));

async function showSessions(more) {
  const q = more && state.nextSessions
    ? "?after=" + encodeURIComponent(state.nextSessions)
    : "?limit=" + rowsToRead(state.sessionsShown);
  const r = await call("GET", "/sessions" + q);
  const headers = ["Tenant", "Session", "Agent", "Residency", "Host", "Epoch", "Gates", "Blocked", "Last command", "Last active"];
  if (more) {
    $("sessions-table").querySelector("tbody").append(...r.sessions.map(sessionRow));
  } else {
    table("sessions-table", headers, r.sessions.map(sessionRow));
  }
  state.sessionsShown = (more ? state.sessionsShown : 0) + r.sessions.length;
  state.nextSessions = r.next;
  $("sessions-more").hidden = !r.next;
  if (state.session) await showSession();
}

async function openSession(tenant, session) {
  state.session = { tenant, session };
  await showSession();
  followSession();
}

function gateActions(g) {
  if (!canOperate()) return el("span", { class: "muted" }, "read-only");
  const actions = g.kind === "ask_user" ? ["answer"] : ["approve", "deny"];
  return actions.map((a) => el("button", {
    class: a === "deny" ? "" : "primary",
    "data-action": a,
    onclick: () => answerGate(g, a),
  }, a));
}

async function answerGate(g, action) {
  let text;
  if (action === "answer") {
    text = prompt(g.prompt || "Answer");
    if (text === null) return;
  }
  try {
    const r = await call("POST", `/gates/${encodeURIComponent(g.tenant_id)}/${encodeURIComponent(g.session_id)}/${g.gate_id}`, { action, text });
    status(`answered: command ${r.command_id} admitted`);
  } catch (e) {
    status(e.message, true);
  }
  refresh();
}

async function showSession() {
  const { tenant, session } = state.session;
  const r = await call("GET", `/sessions/${encodeURIComponent(tenant)}/${encodeURIComponent(session)}`);
  $("session-detail").hidden = false;
  $("session-title").textContent = `${tenant} / ${session}`;
  table("session-gates", ["Gate", "Kind", "Prompt", ""], r.gates.map((g) => el("tr", { "data-gate": g.gate_id },
    el("td", {}, g.gate_id), el("td", {}, g.kind), el("td", { class: "wrap" }, g.prompt), el("td", {}, gateActions(g)))));
  table("session-commands", ["Command", "Kind", "State", "Outcome", "Actor", "Epoch", "Admitted", "Settled"],
    r.commands.map((c) => el("tr", { "data-command": c.command_id },
      el("td", {}, c.command_id), el("td", {}, c.kind), el("td", {}, c.state),
      el("td", {}, c.outcome || ""), el("td", { "data-actor": "" }, actor(c.actor)), el("td", {}, c.epoch),
      el("td", {}, time(c.admitted_at_ms)), el("td", {}, time(c.settled_at_ms)))));
  const list = $("session-journal");
  list.replaceChildren(...r.journal.events.map((e) => journalItem(e.body)));
}

function journalItem(body) {
  const type = body && body.type ? body.type : "event";
  const text = body && (body.text || body.prompt || body.content || "");
  return el("li", {}, el("strong", {}, type), text ? " " + text : "");
}

function followSession() {
  if (state.live) state.live.close();
  const { tenant, session } = state.session;
  const src = new EventSource(`${API}/sessions/${encodeURIComponent(tenant)}/${encodeURIComponent(session)}/live`);
  state.live = src;
  $("live-state").textContent = "";
  src.addEventListener("record", (ev) => {
    $("live-state").textContent = "(live)";
    try {
      const rec = JSON.parse(ev.data);
      $("session-journal").append(journalItem(rec.body));
    } catch (_) { /* a record the page cannot read is shown on the next refresh */ }
  });
  src.addEventListener("open", () => { $("live-state").textContent = "(live)"; });
  src.addEventListener("ended", () => { src.close(); $("live-state").textContent = "(not resident here)"; });
  src.addEventListener("error", () => { src.close(); $("live-state").textContent = "(not resident here: updates on change)"; });
}

function gateRow(g) {
  return el("tr", { "data-gate": g.gate_id },
    el("td", {}, g.tenant_id), el("td", {}, g.session_id), el("td", {}, g.gate_id),
    el("td", {}, g.kind), el("td", { class: "wrap" }, g.prompt), el("td", {}, time(g.opened_at_ms)),
    el("td", {}, gateActions(g)));
}

// Oldest first (the longest wait first), a page at a time; "More" reads the next page.
async function showGates(more) {
  const q = more && state.nextGates
    ? "?after=" + encodeURIComponent(state.nextGates)
    : "?limit=" + rowsToRead(state.gatesShown);
  const r = await call("GET", "/gates" + q);
  if (more) {
    $("gates-table").querySelector("tbody").append(...r.gates.map(gateRow));
  } else {
    table("gates-table", ["Tenant", "Session", "Gate", "Kind", "Prompt", "Opened", ""], r.gates.map(gateRow));
  }
  state.gatesShown = (more ? state.gatesShown : 0) + r.gates.length;
  state.nextGates = r.next;
  $("gates-more").hidden = !r.next;
}

function runRow(x) {
  return el("tr", { class: "clickable", "data-run": x.run_id, onclick: () => openRun(x.tenant_id, x.run_id) },
    el("td", {}, x.tenant_id), el("td", {}, x.run_id),
    el("td", {}, x.state === "needs_attention" ? badge(x.state, "warn") : x.state === "failed" ? badge(x.state, "bad") : x.state),
    el("td", {}, x.step || ""), el("td", { class: "wrap" }, x.failure ? `${x.failure.code}: ${x.failure.message}` : ""),
    el("td", {}, time(x.updated_at_ms)));
}

// Newest first, a page at a time; "More" reads the next page.
async function showRuns(more) {
  const q = more && state.nextRuns
    ? "?after=" + encodeURIComponent(state.nextRuns)
    : "?limit=" + rowsToRead(state.runsShown);
  const r = await call("GET", "/runs" + q);
  if (more) {
    $("runs-table").querySelector("tbody").append(...r.runs.map(runRow));
  } else {
    table("runs-table", ["Tenant", "Run", "State", "Step", "Failure", "Updated"], r.runs.map(runRow));
  }
  state.runsShown = (more ? state.runsShown : 0) + r.runs.length;
  state.nextRuns = r.next;
  $("runs-more").hidden = !r.next;
  if (state.run) await showRun();
}

async function openRun(tenant, run) {
  state.run = { tenant, run };
  await showRun();
}

async function showRun() {
  const { tenant, run } = state.run;
  let r;
  try {
    r = await call("GET", `/runs/${encodeURIComponent(tenant)}/${encodeURIComponent(run)}`);
  } catch (e) {
    $("run-detail").hidden = false;
    $("run-title").textContent = `${run}: ${e.message}`;
    return;
  }
  const v = r.run;
  $("run-detail").hidden = false;
  $("run-title").textContent = `${run} — ${v.state}${v.step ? " at " + v.step : ""}`;
  const actions = $("run-actions");
  actions.replaceChildren();
  if (v.state === "needs_attention" && v.checkpoint && canOperate()) {
    actions.append(
      el("button", { class: "primary", onclick: () => answerRun(v.checkpoint.name, { action: "retry" }) }, "Retry the step"),
      el("button", { onclick: () => {
        const out = prompt("Skip with this output (JSON):", "null");
        if (out === null) return;
        let value;
        try { value = JSON.parse(out); } catch (_) { status("that is not JSON", true); return; }
        answerRun(v.checkpoint.name, { action: "skip", output: value });
      } }, "Skip with a value"),
    );
  }
  if (v.checkpoint && v.checkpoint.kind === "ask" && canOperate()) {
    actions.append(el("button", { class: "primary", onclick: () => {
      const out = prompt(v.checkpoint.question || "Answer (JSON):", "\"\"");
      if (out === null) return;
      let value;
      try { value = JSON.parse(out); } catch (_) { status("that is not JSON", true); return; }
      answerRun(v.checkpoint.name, value);
    } }, `Answer ${v.checkpoint.name}`));
  }
  $("run-started-by").replaceChildren("Started by ", el("span", { "data-actor": "" }, actor(v.started_by)));
  table("run-answers", ["Checkpoint", "Answered by", "Answered"], (v.answers || []).map((a) => el("tr", {},
    el("td", {}, a.checkpoint), el("td", { "data-actor": "" }, actor(a.answerer)), el("td", {}, time(a.answered_at_ms)))));
  table("run-steps", ["Step", "Entry", "Attempt", "Outcome", "Epoch", "Recorded"], (v.journal || []).map((s) => el("tr", {},
    el("td", {}, s.step), el("td", {}, s.entry), el("td", {}, s.attempt), el("td", {}, s.outcome || ""),
    el("td", {}, s.epoch), el("td", {}, time(s.recorded_at_ms)))));
}

async function answerRun(checkpoint, value) {
  const { tenant, run } = state.run;
  try {
    await call("POST", `/runs/${encodeURIComponent(tenant)}/${encodeURIComponent(run)}/answer`, { checkpoint, value });
    status("answered");
  } catch (e) {
    status(e.message, true);
  }
  refresh();
}

// ---------------------------------------------------------------- charts

function drawLine(id, points, color) {
  const c = $(id);
  const ctx = c.getContext("2d");
  const w = c.width, h = c.height;
  ctx.clearRect(0, 0, w, h);
  ctx.strokeStyle = "#d5dbe2";
  ctx.strokeRect(0.5, 0.5, w - 1, h - 1);
  if (points.length < 2) return;
  const max = Math.max(1e-9, ...points);
  ctx.strokeStyle = color;
  ctx.lineWidth = 2;
  ctx.beginPath();
  points.forEach((p, i) => {
    const x = (i / (points.length - 1)) * (w - 4) + 2;
    const y = h - 4 - (p / max) * (h - 16);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
  ctx.fillStyle = "#4a5561";
  ctx.fillText(max.toFixed(max < 10 ? 2 : 0), 4, 10);
}

function drawCharts() {
  const s = state.samples;
  const rate = [], apply = [], attach = [];
  for (let i = 1; i < s.length; i++) {
    const a = s[i - 1].values, b = s[i].values, dt = (s[i].at_ms - s[i - 1].at_ms) / 1000 || 1;
    const dApplied = (b.applied_total || 0) - (a.applied_total || 0);
    rate.push(Math.max(0, dApplied / dt));
    apply.push(dApplied > 0 ? (((b.apply_seconds_sum || 0) - (a.apply_seconds_sum || 0)) / dApplied) * 1000 : 0);
    const dAttached = (b.attached_total || 0) - (a.attached_total || 0);
    attach.push(dAttached > 0 ? (((b.attach_seconds_sum || 0) - (a.attach_seconds_sum || 0)) / dAttached) * 1000 : 0);
  }
  drawLine("chart-applied", rate, "#2563eb");
  drawLine("chart-apply", apply, "#059669");
  drawLine("chart-attach", attach, "#d97706");
}

async function showHostsChart() {
  const r = await call("GET", "/hosts");
  state.hosts = r.hosts;
  const c = $("chart-hosts");
  const ctx = c.getContext("2d");
  const w = c.width, h = c.height;
  ctx.clearRect(0, 0, w, h);
  const max = Math.max(1, ...r.hosts.map((x) => x.sessions));
  const bw = Math.max(8, Math.floor((w - 10) / Math.max(1, r.hosts.length)) - 6);
  r.hosts.forEach((x, i) => {
    const bh = (x.sessions / max) * (h - 30);
    ctx.fillStyle = x.this ? "#2563eb" : "#64748b";
    ctx.fillRect(6 + i * (bw + 6), h - 16 - bh, bw, bh);
    ctx.fillStyle = "#1d232a";
    ctx.fillText(`${x.host_id}: ${x.sessions}`, 6 + i * (bw + 6), h - 4);
  });
  drawCharts();
}

// ---------------------------------------------------------------- live

function follow() {
  if (state.events) state.events.close();
  const src = new EventSource(API + "/events");
  state.events = src;
  src.addEventListener("changed", () => refresh());
  src.addEventListener("metrics", (ev) => {
    try {
      state.samples.push(JSON.parse(ev.data));
      if (state.samples.length > 120) state.samples.shift();
      if (state.view === "charts") drawCharts();
    } catch (_) { /* a sample the page cannot read is skipped */ }
  });
}

window.addEventListener("hashchange", route);
document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", login);
  $("sessions-more").addEventListener("click", () => showSessions(true));
  $("runs-more").addEventListener("click", () => showRuns(true));
  $("gates-more").addEventListener("click", () => showGates(true));
  whoami();
});
