// mwmq's /ui page: asks /ui/api/* and draws what it answers. Every value
// from the server is put in the page as text (never as markup). The session
// lives in this tab only (sessionStorage) and travels as a bearer token.
"use strict";

const REFRESH_MS = 5000;
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

const state = {
  session: sessionStorage.getItem("mwmq-session"),
  login: null,          // who is logged in (a name), if anyone
  loginConfigured: false,
  selected: null,       // the queue whose dead letters are shown
  timer: null,
  sampleS: 10,          // the rates' period, seconds
};

async function api(method, path) {
  const headers = {};
  if (state.session) headers.Authorization = "Bearer " + state.session;
  const r = await fetch(path, { method, headers, cache: "no-store" });
  let body = {};
  try { body = await r.json(); } catch (_) { body = { error: r.statusText }; }
  return { status: r.status, body };
}

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function fmtInt(n) { return Number(n).toLocaleString("en-US"); }

function fmtAge(ms) {
  if (!ms) return "–";
  if (ms < 1000) return ms + " ms";
  const s = ms / 1000;
  if (s < 60) return s.toFixed(1) + " s";
  if (s < 3600) return (s / 60).toFixed(1) + " min";
  if (s < 86400) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

function fmtRate(r) {
  if (r === 0) return "0";
  if (r < 10) return r.toFixed(1);
  return fmtInt(Math.round(r));
}

// The page's state of logging in: who, and what to show.
async function whoami() {
  const asked = state.session;
  const { body } = await api("GET", "/ui/api/session");
  // A login or logout while it was asked: the answer is about an old session.
  if (state.session !== asked) return;
  state.loginConfigured = !!(body.users || body.token);
  state.login = body.login || null;
  if (!state.login && state.session) {
    sessionStorage.removeItem("mwmq-session");
    state.session = null;
  }
  if (body.rates) {
    state.sampleS = body.rates.sample_s;
    const span = body.rates.sample_s * body.rates.samples;
    $("window").textContent = span >= 60 ? Math.round(span / 60) + " min" : Math.round(span) + " s";
  }
  $("login-user").hidden = !body.users;
  $("login-token").hidden = !body.token;
  $("token-or").textContent = body.users ? "or the admin token" : "admin token";
  showLogin();
}

function showLogin() {
  const needs = state.loginConfigured && !state.login;
  $("login").hidden = !needs;
  $("logout").hidden = !state.login;
  $("login-name").textContent = state.login ? "logged in as " + state.login : "";
  const notice = $("notice");
  if (!state.loginConfigured) {
    notice.hidden = false;
    notice.textContent = "No login is configured (no users, no admin token): the page shows figures only; " +
      "dead letters and the buttons need a login.";
  } else {
    notice.hidden = true;
  }
}

async function logIn(ev) {
  ev.preventDefault();
  const user = $("user").value, password = $("password").value, token = $("token").value;
  const headers = {};
  if (token) headers.Authorization = "Bearer " + token;
  else headers.Authorization = "Basic " + btoa(unescape(encodeURIComponent(user + ":" + password)));
  const r = await fetch("/ui/api/login", { method: "POST", headers, cache: "no-store" });
  let body = {};
  try { body = await r.json(); } catch (_) { body = { error: r.statusText }; }
  $("password").value = "";
  $("token").value = "";
  if (r.status !== 200) {
    $("login-error").textContent = body.error || ("login refused: " + r.status);
    return;
  }
  $("login-error").textContent = "";
  state.session = body.session;
  state.login = body.login;
  sessionStorage.setItem("mwmq-session", state.session);
  showLogin();
  refresh();
}

async function logOut() {
  await api("POST", "/ui/api/logout");
  sessionStorage.removeItem("mwmq-session");
  state.session = null;
  state.login = null;
  state.selected = null;
  $("dead").hidden = true;
  showLogin();
  refresh();
}

// A small chart of a queue's rates: sent, handed out (RECV, POP) and dead letters per second.
function chart(rates) {
  const w = 160, h = 30, pad = 2;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  const series = [["sent", rates.sent || []], ["received", rates.received || []], ["dead", rates.dead || []]];
  const n = Math.max(1, ...series.map(([, s]) => s.length));
  const top = Math.max(1e-9, ...series.flatMap(([, s]) => s));
  const axis = document.createElementNS(SVG, "line");
  axis.setAttribute("class", "axis");
  axis.setAttribute("x1", 0); axis.setAttribute("x2", w);
  axis.setAttribute("y1", h - pad); axis.setAttribute("y2", h - pad);
  svg.appendChild(axis);
  for (const [name, s] of series) {
    if (name === "dead" && !s.some((v) => v > 0)) continue;
    const step = (w - 2 * pad) / Math.max(1, 59);
    const x0 = w - pad - step * (s.length - 1);
    const pts = s.map((v, i) => `${(x0 + i * step).toFixed(1)},${(h - pad - (v / top) * (h - 2 * pad)).toFixed(1)}`);
    if (pts.length === 1) pts.push(pts[0]);
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("class", name);
    line.setAttribute("points", pts.join(" "));
    svg.appendChild(line);
  }
  const last = (s) => (s && s.length ? s[s.length - 1] : 0);
  const title = document.createElementNS(SVG, "title");
  title.textContent = `last ${state.sampleS} s: sent ${fmtRate(last(rates.sent))}/s, handed out ${fmtRate(last(rates.received))}/s, ` +
    `acked ${fmtRate(last(rates.acked))}/s, dead ${fmtRate(last(rates.dead))}/s; peak ${fmtRate(top)}/s (of ${n} periods)`;
  svg.appendChild(title);
  return svg;
}

function limitsText(info) {
  const parts = [];
  if (info.concurrency) parts.push("concurrency " + info.concurrency);
  if (info.rate_per_sec) parts.push("rate " + info.rate_per_sec + "/s");
  if (info.max_deliveries) {
    parts.push("max deliveries " + info.max_deliveries + (info.dead_letter ? " → " + info.dead_letter : ", then dropped"));
  }
  if (info.max_messages) parts.push("max " + fmtInt(info.max_messages) + " messages");
  if (info.max_bytes) parts.push("max " + fmtInt(info.max_bytes) + " bytes");
  if (info.retain_ms) parts.push("retain " + fmtAge(info.retain_ms) + " (" + fmtInt(info.archived) + " kept)");
  if (info.backoff_base_ms) {
    parts.push("backoff " + fmtAge(info.backoff_base_ms) + "–" + fmtAge(info.backoff_max_ms) +
      (info.backoff_jitter_pct ? " ±" + info.backoff_jitter_pct + "%" : ""));
  }
  const held = (info.held_by_concurrency || 0) + (info.held_by_rate || 0);
  if (held) parts.push("held back " + fmtInt(held) + "×");
  return parts.join(" · ") || "–";
}

function numCell(field, value, text) {
  const td = el("td", { class: "num", "data-field": field, "data-value": String(value) }, text);
  return td;
}

function button(label, action, queue, enabled, why) {
  const b = el("button", { type: "button", "data-action": action, "data-queue": queue }, label);
  b.disabled = !enabled;
  if (!enabled && why) b.title = why;
  b.addEventListener("click", () => act(action, queue, b));
  return b;
}

function row(q) {
  const info = q.info || {};
  const tr = el("tr", { "data-queue": q.name });
  if (info.paused) tr.classList.add("paused");
  if (q.name === state.selected) tr.classList.add("selected");
  const name = el("td", { class: "name" });
  const open = el("button", { type: "button", title: "show its dead letters" }, q.name);
  open.addEventListener("click", () => showDead(q.name));
  name.appendChild(open);
  tr.appendChild(name);
  if (info.error) {
    const td = el("td", { colspan: "9", class: "error" }, info.error);
    tr.appendChild(td);
    return tr;
  }
  const ready = numCell("ready", info.ready, fmtInt(info.ready));
  const levels = Object.entries(info.ready_by_priority || {}).sort((a, b) => Number(b[0]) - Number(a[0]));
  if (levels.length > 1 || (levels.length === 1 && levels[0][0] !== "0")) {
    // Ready per priority, highest first (the order they are handed out in).
    ready.appendChild(el("div", { class: "levels", "data-field": "ready_by_priority" },
      levels.map(([p, n]) => "p" + p + " " + fmtInt(n)).join(" · ")));
  }
  tr.appendChild(ready);
  tr.appendChild(numCell("delayed", info.delayed, fmtInt(info.delayed)));
  tr.appendChild(numCell("leased", info.leased, fmtInt(info.leased)));
  tr.appendChild(numCell("dead_letters_held", info.dead_letters_held, fmtInt(info.dead_letters_held)));
  tr.appendChild(numCell("oldest_ready_ms", info.oldest_ready_ms, fmtAge(info.oldest_ready_ms)));
  const c = el("td", { class: "chart", "data-field": "rates" });
  c.appendChild(chart(q.rates || {}));
  const last = (s) => (s && s.length ? s[s.length - 1] : 0);
  c.appendChild(el("div", { class: "now" },
    `last ${state.sampleS} s: ${fmtRate(last(q.rates.sent))} in · ${fmtRate(last(q.rates.received))} out/s`));
  tr.appendChild(c);
  tr.appendChild(el("td", { class: "limits", "data-field": "limits" }, limitsText(info)));
  tr.appendChild(el("td", { class: "state", "data-field": "paused", "data-value": String(info.paused) },
    info.paused ? "paused" : "running"));
  const actions = el("td", { class: "actions" });
  const can = !!state.login;
  const why = state.loginConfigured ? "log in first" : "no login is configured";
  actions.appendChild(info.paused
    ? button("resume", "resume", q.name, can, why)
    : button("pause", "pause", q.name, can, why));
  if (info.dead_letters_held > 0) {
    actions.appendChild(document.createTextNode(" "));
    actions.appendChild(button("redrive", "redrive", q.name, can, why));
  }
  tr.appendChild(actions);
  return tr;
}

async function refresh() {
  clearTimeout(state.timer);
  try {
    const filter = $("filter").value;
    const asked = state.session;
    const { status, body } = await api("GET", "/ui/api/queues" + (filter ? "?match=" + encodeURIComponent(filter) : ""));
    if (state.session !== asked) return;
    if (status === 401) {
      await whoami();
      document.querySelector("#queues tbody").replaceChildren();
      $("totals").textContent = "";
      $("updated").textContent = "log in to see the queues";
      return;
    }
    if (status !== 200) {
      $("updated").textContent = "could not read the queues: " + (body.error || status);
      return;
    }
    const tbody = document.querySelector("#queues tbody");
    tbody.replaceChildren(...body.queues.map(row));
    $("empty").hidden = body.queues.length > 0;
    let ready = 0, leased = 0, dead = 0, paused = 0;
    for (const q of body.queues) {
      const i = q.info || {};
      ready += i.ready || 0; leased += i.leased || 0; dead += i.dead_letters_held || 0; paused += i.paused ? 1 : 0;
    }
    const shown = body.queues.length < body.total ? `${body.queues.length} of ${fmtInt(body.total)} queues shown` :
      `${fmtInt(body.total)} queues`;
    $("totals").textContent = `${shown} · ${fmtInt(ready)} ready · ${fmtInt(leased)} leased · ` +
      `${fmtInt(dead)} dead letters · ${paused} paused`;
    $("updated").textContent = "updated " + new Date(body.now_ms).toLocaleTimeString();
    await refreshSchedules();
    document.body.dataset.loaded = String(body.now_ms);
  } catch (e) {
    $("updated").textContent = "mwmq does not answer: " + e;
  } finally {
    state.timer = setTimeout(refresh, REFRESH_MS);
  }
}

// When a schedule runs next or ran last: the time, and how far from now.
function fmtWhen(ms, now) {
  if (ms === null || ms === undefined) return "–";
  const d = ms - now;
  const rel = d >= 0 ? "in " + fmtAge(Math.max(d, 1)) : fmtAge(-d) + " ago";
  return new Date(ms).toLocaleString() + " (" + rel + ")";
}

function scheduleRow(s, now) {
  const tr = el("tr", { "data-schedule": s.name });
  tr.appendChild(el("td", { class: "name" }, s.name));
  tr.appendChild(el("td", { "data-field": "queue" }, s.queue));
  const sends = [];
  if (s.priority) sends.push("priority " + s.priority);
  if (s.group !== null && s.group !== undefined) sends.push("group " + s.group);
  if (s.delay_ms) sends.push("delay " + fmtAge(s.delay_ms));
  tr.appendChild(el("td", { "data-field": "cron" },
    s.cron + (s.tz !== "UTC" ? " (" + s.tz + ")" : "") + (sends.length ? " · " + sends.join(" · ") : "")));
  tr.appendChild(el("td", { "data-field": "catchup" }, s.catchup));
  tr.appendChild(el("td", { "data-field": "next_run_ms", "data-value": String(s.next_run_ms) },
    s.next_run_ms === null ? "never" : fmtWhen(s.next_run_ms, now)));
  tr.appendChild(el("td", { "data-field": "last_run_ms", "data-value": String(s.last_run_ms) },
    s.last_run_ms === null ? "not yet" : fmtWhen(s.last_run_ms, now) + (s.last_id ? " · id " + s.last_id : "")));
  tr.appendChild(numCell("sent", s.sent, fmtInt(s.sent)));
  tr.appendChild(numCell("missed", s.missed, fmtInt(s.missed) + (s.refused ? " · " + fmtInt(s.refused) + " refused" : "")));
  // Suspended: its owner may no longer send its ticks (skipped, with why).
  const suspended = s.state === "suspended";
  tr.appendChild(el("td", { "data-field": "state", "data-value": s.state, class: suspended ? "error" : "" },
    suspended ? "suspended (" + fmtInt(s.skipped) + " skipped): " + s.reason : s.state));
  return tr;
}

async function refreshSchedules() {
  const { status, body } = await api("GET", "/ui/api/schedules");
  const tbody = document.querySelector("#schedules tbody");
  if (status !== 200) {
    tbody.replaceChildren();
    $("schedules-error").textContent = status === 401 ? "" : "could not read the schedules: " + (body.error || status);
    $("schedules-empty").hidden = true;
    return;
  }
  $("schedules-error").textContent = "";
  tbody.replaceChildren(...body.schedules.map((s) => scheduleRow(s, body.now_ms)));
  $("schedules-empty").hidden = body.schedules.length > 0;
  document.body.dataset.schedulesLoaded = String(body.now_ms);
}

async function act(action, queue, b) {
  b.disabled = true;
  const { status, body } = await api("POST", `/ui/api/${action}/${encodeURIComponent(queue)}`);
  const err = $("action-error");
  if (status === 200) {
    err.textContent = "";
    if (action === "redrive") err.textContent = `${queue}: ${body.reply} dead letters moved back`;
  } else {
    err.textContent = `${action} ${queue}: ${body.error || status}`;
    if (status === 401) await whoami();
  }
  await refresh();
  if (state.selected === queue) showDead(queue);
}

async function showDead(queue) {
  state.selected = queue;
  for (const tr of document.querySelectorAll("#queues tbody tr")) {
    tr.classList.toggle("selected", tr.dataset.queue === queue);
  }
  $("dead").hidden = false;
  $("dead-queue").textContent = queue;
  $("dead-where").textContent = "";
  const tbody = document.querySelector("#dead-letters tbody");
  tbody.replaceChildren();
  const { status, body } = await api("GET", "/ui/api/dead/" + encodeURIComponent(queue));
  if (status !== 200) {
    $("dead-error").textContent = body.error || String(status);
    $("dead-empty").hidden = true;
    return;
  }
  $("dead-error").textContent = "";
  const letters = body.dead_letters;
  $("dead-empty").hidden = letters.length > 0;
  const where = [...new Set(letters.map((d) => d.queue).filter((q) => q !== queue))];
  if (where.length) $("dead-where").textContent = "(held in " + where.join(", ") + ")";
  tbody.replaceChildren(...letters.map((d) => {
    const tr = el("tr", { "data-id": String(d.id) });
    tr.appendChild(el("td", { class: "num" }, d.id));
    tr.appendChild(el("td", {}, d.queue));
    tr.appendChild(el("td", {}, d.from));
    tr.appendChild(el("td", {}, d.reason || ""));
    tr.appendChild(el("td", { class: "num" }, d.deliveries));
    tr.appendChild(el("td", {}, d.sender));
    tr.appendChild(el("td", {}, new Date(d.sent_at_ms).toLocaleString()));
    tr.appendChild(el("td", { class: "body" }, d.body + (d.cut ? ` … (${fmtInt(d.size)} bytes)` : "")));
    return tr;
  }));
}

$("login-form").addEventListener("submit", logIn);
$("logout").addEventListener("click", logOut);
let filterTimer = null;
$("filter").addEventListener("input", () => { clearTimeout(filterTimer); filterTimer = setTimeout(refresh, 300); });
whoami().then(refresh);
