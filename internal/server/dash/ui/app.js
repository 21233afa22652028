// floodgate's dashboard: polls GET /v1/dashboard every second and draws
// it. The token, when the server has one, is asked once and kept for the
// browser tab (sessionStorage), and sent as a bearer header.
"use strict";

const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("floodgate-token") || "";
let chart = null, latencyChart = null, last = null;

async function api(path) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const r = await fetch(path, { headers, cache: "no-store" });
  if (r.status === 401) throw new Error("unauthorized");
  if (!r.ok) throw new Error((await r.json().catch(() => ({}))).detail || r.statusText);
  return r.json();
}

function askToken(message) {
  $("main").hidden = true;
  $("token-form").hidden = false;
  $("token-error").textContent = message || "";
  $("token").focus();
}

$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  token = $("token").value;
  sessionStorage.setItem("floodgate-token", token);
  poll();
});

function text(el, s) { el.textContent = s; return el; }
function cell(tr, s, cls) { const td = text(document.createElement("td"), s); if (cls) td.className = cls; tr.appendChild(td); return td; }
function fmt(n) { return n >= 100 ? Math.round(n).toString() : (Math.round(n * 10) / 10).toString(); }

// Vertical lines at the switches to and from the fallback.
function eventsPlugin() {
  return {
    hooks: {
      draw: [(u) => {
        if (!last) return;
        const ctx = u.ctx;
        ctx.save();
        for (const ev of last.store.events) {
          const x = u.valToPos(ev.at / 1000, "x", true);
          if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
          ctx.strokeStyle = ev.state === "degraded" ? "#c62828" : "#2e7d32";
          ctx.lineWidth = 2;
          ctx.setLineDash([4, 4]);
          ctx.beginPath();
          ctx.moveTo(x, u.bbox.top);
          ctx.lineTo(x, u.bbox.top + u.bbox.height);
          ctx.stroke();
        }
        ctx.restore();
      }],
    },
  };
}

function width(el) { return Math.max(300, el.clientWidth - 8); }

// The x axis spans the samples held, up to the last 15 minutes, even
// when there are only one or two.
function xRange() {
  if (!last || !last.times.length) return [Date.now() / 1000 - 60, Date.now() / 1000];
  const end = last.times[last.times.length - 1] / 1000;
  const start = Math.min(last.times[0] / 1000, end - 10 * last.step_ms / 1000);
  return [start, end];
}

function drawTraffic(s) {
  const rule = $("rule-select").value;
  const names = rule ? [rule] : Object.keys(s.series);
  const n = s.times.length;
  const allowed = new Array(n).fill(0), denied = new Array(n).fill(0);
  for (const name of names) {
    const ser = s.series[name];
    if (!ser) continue;
    for (let i = 0; i < n; i++) { allowed[i] += ser.allowed[i]; denied[i] += ser.denied[i]; }
  }
  const data = [s.times.map((t) => t / 1000), allowed, denied];
  const el = $("chart");
  if (!chart) {
    chart = new uPlot({
      width: width(el), height: 260, plugins: [eventsPlugin()],
      scales: { x: { time: true, range: xRange }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
      axes: [{}, { label: "decisions/s", size: 60 }],
      series: [{}, { label: "allowed", stroke: "#2e7d32", fill: "rgba(46,125,50,.08)" },
        { label: "denied", stroke: "#c62828", fill: "rgba(198,40,40,.08)" }],
    }, data, el);
  } else {
    chart.setData(data);
  }
  el.dataset.points = String(allowed.filter((v, i) => v + denied[i] > 0).length);
  el.dataset.denied = String(denied.reduce((a, b) => a + b, 0));
}

function drawLatency(s) {
  const data = [s.times.map((t) => t / 1000), s.store.latency_p50_ms, s.store.latency_p99_ms];
  if (!latencyChart) {
    latencyChart = new uPlot({
      width: width($("latency")), height: 160, plugins: [eventsPlugin()],
      scales: { x: { time: true, range: xRange }, y: { range: (u, min, max) => [0, Math.max(0.5, max * 1.2)] } },
      axes: [{}, { label: "ms", size: 50 }],
      series: [{}, { label: "p50", stroke: "#1565c0" }, { label: "p99", stroke: "#ef6c00" }],
    }, data, $("latency"));
  } else {
    latencyChart.setData(data);
  }
}

function drawStore(s) {
  text($("store-name"), s.store.name);
  const degraded = s.store.state === "degraded";
  const badge = text($("store-state"), degraded ? "fallback answering" : "store answering");
  badge.className = "badge" + (degraded ? " degraded" : "");
  badge.dataset.state = s.store.state;
  const ul = $("events");
  ul.replaceChildren();
  const evs = s.store.events.slice(-10).reverse();
  for (const ev of evs) {
    const li = document.createElement("li");
    li.className = "event";
    li.dataset.state = ev.state;
    text(li, new Date(ev.at).toLocaleTimeString() + ": " + (ev.state === "degraded" ? "store failing, fallback answers" : "store back"));
    ul.appendChild(li);
  }
  if (!evs.length) ul.appendChild(text(Object.assign(document.createElement("li"), { className: "muted" }), "none"));
  const r = s.store.redis;
  $("redis").hidden = !r;
  if (r) {
    text($("redis-policy"), r.maxmemory_policies.join(", ") || "unknown").dataset.evicts = String(r.evicts);
    text($("redis-evicted"), String(r.evicted_keys));
    text($("redis-restarts"), String(r.restarts));
    $("redis-warning").hidden = !r.evicts;
  }
}

function drawTop(s) {
  const tbody = $("top").tBodies[0];
  tbody.replaceChildren();
  const rows = [];
  for (const [rule, keys] of Object.entries(s.top)) for (const k of keys) rows.push([rule, k]);
  rows.sort((a, b) => b[1].count - a[1].count);
  for (const [rule, k] of rows.slice(0, 25)) {
    const tr = document.createElement("tr");
    tr.className = "top-key";
    cell(tr, rule);
    cell(tr, k.key).className = "key";
    cell(tr, k.error ? `${k.count} (±${k.error})` : String(k.count), "num");
    tbody.appendChild(tr);
  }
  if (!rows.length) { const tr = document.createElement("tr"); cell(tr, "no denials", "muted").colSpan = 3; tbody.appendChild(tr); }
  text($("top-note"), `Counted in bounded memory (Space-Saving); a count is at most its ± over the truth, and at most ${s.top_error_bound} is ever uncertain.`);
}

function drawRules(s) {
  const tbody = $("rules").tBodies[0];
  const sel = $("rule-select"), ins = $("inspect-rule");
  const names = s.rules.map((r) => r.name).concat((s.concurrency || []).map((c) => "c:" + c.name)).join("\n");
  if (tbody.dataset.names === names) return;
  tbody.dataset.names = names;
  tbody.replaceChildren();
  const keep = sel.value, keepIns = ins.value;
  sel.replaceChildren(Object.assign(document.createElement("option"), { value: "", textContent: "all rules" }));
  ins.replaceChildren();
  for (const r of s.rules) {
    const tr = document.createElement("tr");
    cell(tr, r.name);
    cell(tr, r.limits.join("; "));
    const t = cell(tr, "");
    if (r.shadow) t.appendChild(text(Object.assign(document.createElement("span"), { className: "tag" }), "shadow"));
    tbody.appendChild(tr);
    sel.appendChild(Object.assign(document.createElement("option"), { value: r.name, textContent: r.name }));
    ins.appendChild(Object.assign(document.createElement("option"), { value: r.name, textContent: r.name }));
  }
  // Concurrency rules are explained too: their slots held on the key.
  for (const c of s.concurrency || []) {
    ins.appendChild(Object.assign(document.createElement("option"), { value: c.name, textContent: c.name + " (concurrency)" }));
  }
  sel.value = keep; ins.value = keepIns || (s.rules[0] || {}).name || "";
}

// Concurrency rules: each rule's line, then its keys that acquired most.
function drawSlots(s) {
  const rules = s.concurrency || [];
  $("slots-section").hidden = !rules.length;
  const tbody = $("slots").tBodies[0];
  tbody.replaceChildren();
  for (const r of rules) {
    const tr = document.createElement("tr");
    cell(tr, r.name);
    cell(tr, `${r.slots} slots, lease ${ms(r.lease_ms)}` + (r.rates && r.rates.length ? `, with ${r.rates.join(", ")}` : "")).colSpan = 4;
    tbody.appendChild(tr);
    for (const h of r.holders) {
      const row = document.createElement("tr");
      row.className = "holder";
      cell(row, "");
      cell(row, h.key).className = "key";
      cell(row, h.error ? `${h.acquires} (±${h.error})` : String(h.acquires), "num");
      cell(row, h.held < 0 ? "?" : `${h.held} of ${r.slots}`, "num");
      cell(row, h.free_in_ms === null ? "" : ms(h.free_in_ms), "num");
      tbody.appendChild(row);
    }
  }
}

function drawDomains(s) {
  const doms = s.domains || [];
  $("domains-section").hidden = !doms.length;
  const tbody = $("domains").tBodies[0];
  tbody.replaceChildren();
  for (const d of doms) {
    const tr = document.createElement("tr");
    tr.className = "domain";
    cell(tr, d.name).className = "name";
    cell(tr, String(d.descriptors), "num");
    cell(tr, String(d.hits), "num");
    cell(tr, String(d.over_limit), "num");
    tbody.appendChild(tr);
  }
}

$("rule-select").addEventListener("change", () => last && drawTraffic(last));

// "Inspect a key" explains it (GET /v1/explain): each limit in force and
// its state, the one that decides, and why, in sentences. It charges
// nothing.
$("inspect").addEventListener("submit", async (e) => {
  e.preventDefault();
  const q = new URLSearchParams({ rule: $("inspect-rule").value, key: $("inspect-key").value });
  try {
    drawExplain(await api("/v1/explain?" + q));
  } catch (err) {
    $("inspect-limits").hidden = true;
    text($("inspect-out"), err.message).className = "error";
  }
});

function ms(n) { return n >= 1000 ? fmt(n / 1000) + " s" : n + " ms"; }

function drawExplain(r) {
  const table = $("inspect-limits"), tbody = table.tBodies[0];
  tbody.replaceChildren();
  for (const l of r.limits) {
    const tr = document.createElement("tr");
    if (l.decides) tr.className = "decides";
    cell(tr, String(l.index), "num");
    cell(tr, l.summary + (l.from === "override" ? " (override)" : ""));
    cell(tr, `${l.remaining} of ${l.quota}`, "num");
    cell(tr, ms(l.reset_after_ms), "num");
    // null: a peek cannot tell a bucket's next unit; it comes by the reset.
    cell(tr, l.retry_after_ms === null ? "≤ " + ms(l.reset_after_ms) : l.retry_after_ms < 0 ? "never" : ms(l.retry_after_ms), "num");
    cell(tr, l.decides ? "decides" : "");
    tbody.appendChild(tr);
  }
  table.hidden = !r.limits.length; // a concurrency rule has none: its why says it all
  const out = text($("inspect-out"), r.why.join("\n"));
  out.className = r.allowed ? "" : "denied";
  out.dataset.allowed = String(r.allowed);
}

async function poll() {
  try {
    const s = await api("/v1/dashboard");
    last = s;
    $("token-form").hidden = true;
    $("main").hidden = false;
    drawRules(s);
    drawDomains(s);
    drawStore(s);
    drawTraffic(s);
    drawLatency(s);
    drawTop(s);
    drawSlots(s);
    text($("updated"), "updated " + new Date(s.now).toLocaleTimeString());
    document.body.dataset.updated = String(s.now);
  } catch (err) {
    if (err.message === "unauthorized") { askToken(token ? "wrong token" : ""); return; }
    text($("updated"), "cannot reach floodgate: " + err.message);
  }
  setTimeout(poll, 1000);
}

window.addEventListener("resize", () => {
  if (chart) chart.setSize({ width: width($("chart")), height: 260 });
  if (latencyChart) latencyChart.setSize({ width: width($("latency")), height: 160 });
});

poll();
