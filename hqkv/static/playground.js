// The hqkv Playground: a chat box streaming from this server's OpenAI endpoints, and the Monitor of its KV pool.
// The Monitor polls v1/hqkv/pool (hqkv.monitor.pool_state on the engine thread, the data PoolMonitor draws in a
// notebook) and draws the same two panels: the pool's page bands over time, and each live request's pages.
// Every URL here is relative: behind a prefix (a proxy serving the server at /hqkv/) the page still works.
"use strict";

const $ = (id) => document.getElementById(id);
const BANDS = ["used", "reserved", "retained", "free"];
const WINDOW_S = 60, MIN_SPAN_S = 10, POLL_MS = 250, HIDDEN_POLL_MS = 2000;

// Everything the page knows, in one object (also read by tests: window.hqkvPlayground).
const state = {
  last: null,          // the latest answer of v1/hqkv/pool
  history: [],         // band rows {step, time, used, reserved, retained, free}, oldest first (the last WINDOW_S seconds)
  since: null,         // the time of the newest row we have (server clock)
  now: 0,              // the server clock at the latest answer
  mine: null,          // the id (cmpl-..., chatcmpl-...) of the request this page is streaming
  mineTrace: [],       // [{time, used}] of this page's latest request, one point per poll
  mineMaxUsed: 0,      // the most pages this page's latest request held at a poll
  busy: false, controller: null,
  messages: [],        // the chat so far (chat mode)
  answers: 0,          // finished answers (tests wait on it)
  errors: [],          // messages shown in the error box
  pollError: null,
};
window.hqkvPlayground = state;

// ------------------------------------------------------------------ the Monitor
async function poll() {
  try {
    const q = state.since === null ? "" : "?since=" + encodeURIComponent(state.since);
    const r = await fetch("v1/hqkv/pool" + q, { cache: "no-store" });
    if (!r.ok) throw new Error(await httpError(r));
    const s = await r.json();
    if (s.now < state.now) { state.history = []; state.mineTrace = []; state.since = null; }   // a restarted server: its clock began again
    state.history.push(...s.history);
    if (s.history.length) state.since = s.history[s.history.length - 1].time;
    state.now = s.now;
    while (state.history.length > 1 && state.history[1].time < s.now - WINDOW_S) state.history.shift();
    state.last = s;
    if (state.mine !== null) {
      const mine = s.seqs.find((x) => x.request === state.mine);
      const used = mine ? mine.used : 0;
      state.mineTrace.push({ time: s.time, used });
      state.mineMaxUsed = Math.max(state.mineMaxUsed, used);
      if (!mine && !state.busy) state.mine = null;   // it ended and its pages are back: the trace stays drawn until the next request
    }
    state.pollError = null;
    render();
  } catch (e) {
    state.pollError = String(e.message || e);
    $("monitor-status").textContent = "(cannot read the pool: " + state.pollError + ")";
  } finally {
    setTimeout(poll, document.hidden ? HIDDEN_POLL_MS : POLL_MS);
  }
}

function render() {
  const s = state.last;
  if (!s) return;
  $("monitor-status").textContent = `step ${s.step} · ${s.seqs.length} live request${s.seqs.length === 1 ? "" : "s"}`;
  $("kv-format").textContent = "format " + s.format;
  $("bit-plan-tag").textContent = "bit plan " + s.bit_plan;
  $("plan").textContent = s.plan;
  renderGauges(s);
  drawBands(s);
  drawSeqs(s);
  renderBitPlan(s);
}

function renderGauges(s) {
  const g = $("gauges");
  g.replaceChildren(...BANDS.map((b) => {
    const el = document.createElement("span");
    el.className = "g";
    el.dataset.band = b;
    el.innerHTML = `<span class="sw" style="background:${s.colors[b]}"></span>${b} <b>${s[b]}</b>`;
    return el;
  }));
  const of = document.createElement("span");
  of.className = "of";
  of.textContent = `of ${s.total} pages · ${s.page_tokens} tokens, ${s.page_bytes.toLocaleString("en")} bytes a page`;
  g.append(of);
  for (const b of BANDS) g.dataset[b] = s[b];
  g.dataset.total = s.total;
}

function canvasContext(c, cssHeight) {
  if (cssHeight) c.style.height = cssHeight + "px";
  const dpr = window.devicePixelRatio || 1, w = c.clientWidth, h = c.clientHeight;
  if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) { c.width = Math.round(w * dpr); c.height = Math.round(h * dpr); }
  const ctx = c.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  ctx.font = "11px system-ui, sans-serif";
  return [ctx, w, h];
}

// Left panel of pool_figure: the four bands stacked, each row's state held until the next row (a step plot).
function drawBands(s) {
  const [ctx, W, H] = canvasContext($("bands"));
  const pad = { l: 42, r: 10, t: 10, b: 22 };
  const rows = state.history.length ? state.history : [s];
  const now = Math.max(state.now, rows[rows.length - 1].time);
  const span = Math.min(WINDOW_S, Math.max(MIN_SPAN_S, now - rows[0].time));
  const t0 = now - span, total = Math.max(1, s.total);
  // a big pool and a few requests: the axis zooms to what is taken (free pages fill the rest), else the whole pool
  const taken = Math.max(0, ...rows.filter((r, i) => i + 1 >= rows.length || rows[i + 1].time >= t0).map((r) => r.used + r.reserved + r.retained));
  const top = taken * 1.5 >= total / 2 ? total : Math.min(total, niceCeil(Math.max(8, taken * 1.5)));
  const x = (t) => pad.l + (Math.max(t, t0) - t0) / span * (W - pad.l - pad.r);
  const y = (p) => H - pad.b - Math.min(p, top) / top * (H - pad.t - pad.b);
  for (let i = 0; i < rows.length; i++) {
    const r = rows[i], x0 = x(r.time), x1 = x(i + 1 < rows.length ? rows[i + 1].time : now);
    if (x1 <= x0) continue;
    let base = 0;
    for (const b of BANDS) {
      ctx.fillStyle = s.colors[b];
      ctx.fillRect(x0, y(base + r[b]), x1 - x0 + 0.5, y(base) - y(base + r[b]));
      base += r[b];
    }
  }
  // this page's request: its pages at each poll, a dark line over the used band
  if (state.mineTrace.length) {
    ctx.strokeStyle = "#111"; ctx.lineWidth = 2; ctx.beginPath();
    state.mineTrace.forEach((p, i) => {
      const px = x(p.time), py = y(p.used);
      if (i === 0) ctx.moveTo(px, py); else { ctx.lineTo(px, y(state.mineTrace[i - 1].used)); ctx.lineTo(px, py); }
    });
    ctx.stroke();
    const top = state.mineTrace.reduce((a, p) => (p.used > a.used ? p : a), state.mineTrace[0]);
    if (top.used > 0) { ctx.fillStyle = "#111"; ctx.fillText("this request", Math.min(x(top.time) + 4, W - 70), y(top.used) - 4); }
  }
  // axes: pages up, seconds before now across
  ctx.strokeStyle = "#999"; ctx.lineWidth = 1; ctx.fillStyle = "#555";
  ctx.beginPath(); ctx.moveTo(pad.l, pad.t); ctx.lineTo(pad.l, H - pad.b); ctx.lineTo(W - pad.r, H - pad.b); ctx.stroke();
  ctx.textAlign = "right"; ctx.textBaseline = "middle";
  for (const p of [0, Math.round(top / 2), top]) ctx.fillText(String(p), pad.l - 4, y(p));
  if (top < total) { ctx.textAlign = "right"; ctx.textBaseline = "top"; ctx.fillText(`zoomed to ${top} of ${total} pages`, W - pad.r - 4, pad.t + 3); }
  ctx.save(); ctx.translate(10, (pad.t + H - pad.b) / 2); ctx.rotate(-Math.PI / 2); ctx.textAlign = "center"; ctx.fillText("pages", 0, 0); ctx.restore();
  ctx.textAlign = "center"; ctx.textBaseline = "top";
  const ticks = span > 30 ? [60, 45, 30, 15, 0] : span > 15 ? [30, 20, 10, 0] : [10, 5, 0];
  for (const a of ticks) if (a <= span + 1e-9 && x(now - a) > pad.l + 16) ctx.fillText(a ? `-${a} s` : "now", x(now - a), H - pad.b + 4);
}

// Right panel of pool_figure: per live request its shared pages (light), own pages, and reserved pages.
function drawSeqs(s) {
  const seqs = s.seqs.slice(0, 12), rowH = 22;
  const [ctx, W, H] = canvasContext($("seqs"), Math.max(56, seqs.length * rowH + 14));
  if (!seqs.length) {
    ctx.fillStyle = "#888"; ctx.textAlign = "center"; ctx.textBaseline = "middle";
    ctx.fillText("no live requests", W / 2, H / 2);
    return;
  }
  const pad = { l: 96 };
  const most = Math.max(1, ...seqs.map((q) => q.used + q.reserved));
  const px = (p) => p / (most * 1.6) * (W - pad.l - 8);   // as pool_figure: the longest bar, then room for its label
  seqs.forEach((q, i) => {
    const y0 = 6 + i * rowH, h = rowH - 6, mine = state.mine !== null && q.request === state.mine;
    let x0 = pad.l;
    const parts = [[q.shared, s.colors.used, 0.5], [q.used - q.shared, s.colors.used, 1], [q.reserved, s.colors.reserved, 1]];
    for (const [n, color, alpha] of parts) {
      ctx.globalAlpha = alpha; ctx.fillStyle = color; ctx.fillRect(x0, y0, px(n), h); x0 += px(n);
    }
    ctx.globalAlpha = 1;
    if (mine) { ctx.strokeStyle = "#111"; ctx.lineWidth = 2; ctx.strokeRect(pad.l - 1, y0 - 1, px(q.used) + 2, h + 2); }
    ctx.fillStyle = mine ? "#111" : "#555"; ctx.font = (mine ? "bold " : "") + "11px system-ui, sans-serif";
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    ctx.fillText(mine ? "this request" : "request " + q.seq_id, pad.l - 6, y0 + h / 2);
    ctx.textAlign = "left"; ctx.font = "11px system-ui, sans-serif"; ctx.fillStyle = "#555";
    ctx.fillText(`${q.used}+${q.reserved} pages · ${q.tokens}/${q.bound_tokens} tok`, x0 + 6, y0 + h / 2);
  });
  if (s.seqs.length > seqs.length) { ctx.fillStyle = "#888"; ctx.textAlign = "right"; ctx.fillText(`(${seqs.length} of ${s.seqs.length} shown)`, W - 4, H - 6); }
}

function niceCeil(v) {   // the next 1, 2, 5 x 10^k at or above v
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  return [1, 2, 5, 10].map((m) => m * p).find((c) => c >= v);
}

function bitColor(bits) {   // 2 bits light ... 16 bits dark
  const f = Math.min(1, Math.max(0, (Math.log2(bits) - 1) / 3));
  return `hsl(220, 45%, ${Math.round(85 - 55 * f)}%)`;
}

function renderBitPlan(s) {
  const el = $("bitplan"), key = JSON.stringify(s.layers);
  if (el.dataset.key === key) return;
  el.dataset.key = key;
  el.style.gridTemplateColumns = `auto repeat(${s.layers.length}, minmax(3px, 1fr))`;
  const cells = [];
  for (const kind of ["k", "v"]) {
    const label = document.createElement("span");
    label.className = "row-label"; label.textContent = kind === "k" ? "K" : "V";
    cells.push(label);
    for (const l of s.layers) {
      const c = document.createElement("span");
      c.className = "cell"; c.style.background = bitColor(l[kind + "_bits"]);
      c.title = `layer ${l.layer} ${kind === "k" ? "keys" : "values"}: ${l[kind]}, ${l[kind + "_bits"]} bits per value`;
      cells.push(c);
    }
  }
  el.replaceChildren(...cells);
}

// ------------------------------------------------------------------ the chat
async function httpError(r) {
  let msg = "";
  try { const j = await r.json(); msg = (j.error && j.error.message) || (j.detail && JSON.stringify(j.detail)) || ""; } catch (e) { /* not JSON */ }
  const what = { 400: "refused", 429: "busy", 503: "unavailable" }[r.status] || "error";
  const after = r.headers.get("Retry-After");
  return `${r.status} ${what}: ${msg || r.statusText}` + (after ? ` (retry after ${after} s)` : "");
}

function showError(msg) {
  const el = $("error");
  if (!msg) { el.hidden = true; el.textContent = ""; return; }
  state.errors.push(msg);
  el.hidden = false; el.textContent = msg;
}

function addMessage(role, text) {
  const hint = document.querySelector("#log .hint");
  if (hint) hint.remove();
  const el = document.createElement("div");
  el.className = "msg " + role;
  const body = document.createElement("span");
  body.className = "text"; body.textContent = text;
  el.append(body);
  $("log").append(el);
  $("log").scrollTop = $("log").scrollHeight;
  return el;
}

function number(id) {   // the control's value as a number when it is one (else as typed: the server says what is wrong)
  const v = $(id).value.trim();
  return v !== "" && isFinite(Number(v)) ? Number(v) : v;
}

async function send(ev) {
  if (ev) ev.preventDefault();
  const text = $("prompt").value;
  if (!text.trim() || state.busy) return;
  showError(null);
  const chat = $("mode").value === "chat";
  const body = { max_tokens: number("max-tokens"), temperature: number("temperature"), stream: true, stream_options: { include_usage: true } };
  if (chat) body.messages = [...state.messages, { role: "user", content: text }];
  else body.prompt = text;
  const user = addMessage("user", text), out = addMessage("assistant", "");
  $("prompt").value = "";
  const textEl = out.querySelector(".text");
  out.classList.add("streaming");
  state.busy = true; state.controller = new AbortController(); state.mine = null; state.mineTrace = []; state.mineMaxUsed = 0;
  $("send").disabled = true; $("stop").disabled = false;
  const t0 = performance.now();
  let finish = null, usage = null, answer = "", failed = false, error = null;
  try {
    const r = await fetch(chat ? "v1/chat/completions" : "v1/completions", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal: state.controller.signal });
    if (!r.ok) { failed = true; error = await httpError(r); showError(error); return; }
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = "", done = false;
    while (!done) {
      const { value, done: end } = await reader.read();
      if (end) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while (!done && (i = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, i); buf = buf.slice(i + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") { done = true; break; }
          const o = JSON.parse(data);
          if (o.error) { failed = true; error = "the request failed: " + o.error.message; showError(error); continue; }
          if (o.id && state.mine === null) state.mine = o.id;
          if (o.usage) usage = o.usage;
          const c = o.choices && o.choices[0];
          if (!c) continue;
          const delta = chat ? (c.delta && c.delta.content) || "" : c.text || "";
          if (delta) { answer += delta; textEl.textContent = answer; $("log").scrollTop = $("log").scrollHeight; }
          if (c.finish_reason) finish = c.finish_reason;
        }
      }
    }
  } catch (e) {
    if (e.name === "AbortError") finish = "stopped";
    else { failed = true; error = "cannot reach the server: " + (e.message || e); showError(error); }
  } finally {
    out.classList.remove("streaming");
    state.busy = false; state.controller = null;
    $("send").disabled = false; $("stop").disabled = true;
    if (failed && !answer) {   // the message stays, with the server's answer under it
      out.remove(); user.classList.add("failed");
      const note = document.createElement("span");
      note.className = "meta"; note.textContent = error;
      user.append(note);
      if (!$("prompt").value) $("prompt").value = text;
    }
    else {
      const secs = (performance.now() - t0) / 1000, n = usage ? usage.completion_tokens : null;
      const meta = document.createElement("span");
      meta.className = "meta";
      meta.textContent = [n !== null ? `${n} tokens` : null, `${secs.toFixed(1)} s`, n ? `${(n / secs).toFixed(1)} tokens/s` : null,
                          finish ? `finish: ${finish}` : null, state.mineMaxUsed ? `at most ${state.mineMaxUsed} pages seen` : null].filter(Boolean).join(" · ");
      out.append(meta);
      if (chat && !failed) state.messages.push({ role: "user", content: text }, { role: "assistant", content: answer });
      if (!failed) state.answers += 1;
    }
  }
}

$("ask").addEventListener("submit", send);
$("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); } });
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("clear").addEventListener("click", () => {
  state.messages = []; showError(null);
  $("log").innerHTML = '<p class="hint">A new chat. The old turns\' pages stay in the pool as retained pages until it needs the room.</p>';
});
$("mode").addEventListener("change", () => { $("clear").disabled = $("mode").value !== "chat"; });
window.addEventListener("resize", render);

fetch("v1/models").then((r) => (r.ok ? r.json() : Promise.reject(new Error(String(r.status)))))
  .then((j) => { $("model").textContent = "model " + (j.data[0] ? j.data[0].id : "?"); })
  .catch((e) => { $("model").textContent = "model ? (" + e.message + ")"; });
poll();
