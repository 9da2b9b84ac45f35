"""The web console's script and style sheet, served from ``/ui/static/`` (the pages' Content Security
Policy runs no inline script or style).

The script keeps a page live without reloading it: it follows ``/ui/watch`` (server-sent events of
Work changes) or polls, and on each change fetches the page again and swaps its ``#live`` part (the
server's escaped HTML, parsed without running anything). It rewrites every ``<time data-ms>`` in the
browser's own time zone with the offset and a relative form, and posts the action buttons as JSON with
the page's CSRF token (``X-Loom-CSRF``), asking first where a button says ``data-confirm``.
"""

from __future__ import annotations

SCRIPT = r"""
"use strict";
(() => {
  const body = document.body;
  const csrf = document.querySelector('meta[name="loom-csrf"]').content;
  const testClock = body.dataset.testClock === "1";
  let base = { server: Number(body.dataset.now), local: Date.now() };
  let refreshes = 0;

  function pad(n, width = 2) { return String(n).padStart(width, "0"); }

  function localTime(ms) {
    const d = new Date(ms);
    const offset = -d.getTimezoneOffset();
    const size = Math.abs(offset);
    const frac = ms % 1000 ? "." + pad(d.getMilliseconds(), 3) : "";
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}${frac}` +
      `${offset >= 0 ? "+" : "-"}${pad(Math.floor(size / 60))}:${pad(size % 60)}`;
  }

  function relative(ms, now) {
    const delta = ms - now;
    const size = Math.abs(delta);
    if (size < 1000) return "now";
    let amount = "";
    for (const [unit, width] of [["d", 86400000], ["h", 3600000], ["min", 60000], ["s", 1000]]) {
      if (size >= width) { amount = `${Math.floor(size / width)} ${unit}`; break; }
    }
    return delta > 0 ? `in ${amount}` : `${amount} ago`;
  }

  function serverNow() {
    return testClock ? base.server : base.server + (Date.now() - base.local);
  }

  function stamp() {
    const now = serverNow();
    for (const t of document.querySelectorAll("time[data-ms]")) {
      const ms = Number(t.dataset.ms);
      const rel = document.createElement("span");
      rel.className = "rel";
      rel.textContent = `(${relative(ms, now)})`;
      t.replaceChildren(document.createTextNode(localTime(ms) + " "), rel);
      t.title = t.getAttribute("datetime");
    }
  }

  function status(text, on) {
    const el = document.getElementById("live-status");
    el.textContent = text;
    el.className = on ? "live-on" : "live-off";
    body.dataset.live = on ? "on" : "off";
  }

  function flash(message, failed) {
    const el = document.getElementById("flash");
    el.textContent = message;
    el.className = failed ? "failed" : "done";
  }

  let inflight = false, again = false, timer = null;
  async function refresh() {
    if (inflight) { again = true; return; }
    inflight = true;
    try {
      const answer = await fetch(location.href, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (answer.ok) {
        const doc = new DOMParser().parseFromString(await answer.text(), "text/html");
        const fresh = doc.getElementById("live");
        const live = document.getElementById("live");
        if (fresh && live) {
          base = { server: Number(doc.body.dataset.now), local: Date.now() };
          live.replaceWith(document.adoptNode(fresh));
          stamp();
        }
      }
      body.dataset.refreshes = String(++refreshes);
    } catch (error) {
      status("reconnecting", false);
    } finally {
      inflight = false;
      if (again) { again = false; schedule(); }
    }
  }

  function schedule() {
    if (timer === null) timer = setTimeout(() => { timer = null; refresh(); }, 250);
  }

  if (body.dataset.watch) {
    const source = new EventSource(body.dataset.watch);
    // "ready" comes once the server watches: refresh then, so nothing between the page and the watch is missed
    source.addEventListener("ready", () => { status("live", true); schedule(); });
    source.addEventListener("error", () => status("reconnecting", false));
    for (const kind of ["work", "changed", "lagged"]) source.addEventListener(kind, schedule);
  } else if (body.dataset.poll) {
    const seconds = Number(body.dataset.poll);
    status(`live (every ${seconds} s)`, true);
    setInterval(refresh, seconds * 1000);
  }
  setInterval(stamp, 5000);
  stamp();

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const target = JSON.parse(button.dataset.target);
    const input = document.getElementById("reason");
    const reason = input ? input.value.trim() : "";
    if (reason && !("revision" in target)) target.reason = reason;
    if (button.dataset.action === "hold" && !reason) {
      flash("A hold needs a reason: type it in the reason field first.", true);
      if (input) input.focus();
      return;
    }
    if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
    button.disabled = true;
    try {
      const answer = await fetch(`/ui/act/${encodeURIComponent(button.dataset.action)}`, {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-Loom-CSRF": csrf },
        body: JSON.stringify(target),
      });
      const said = await answer.json().catch(() => ({ message: answer.statusText }));
      flash(said.message || (answer.ok ? "done" : "refused"), !answer.ok);
      if (answer.ok && input) input.value = "";
      await refresh();
    } catch (error) {
      flash(String(error), true);
    } finally {
      button.disabled = false;
    }
  });
})();
"""

ICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3"'
    ' fill="#1f2933"/><path d="M4 3v10h8" stroke="#7cc4fa" stroke-width="2" fill="none"/></svg>'
)

STYLE = """
:root { --line: #d0d4d9; --muted: #5f6b76; --bg: #f6f7f9; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1b1f23; background: #fff; }
header { display: flex; gap: 1.2rem; align-items: center; padding: .55rem 1.2rem; background: #1f2933; color: #fff; }
header a { color: #e4e7eb; text-decoration: none; }
header a[aria-current] { color: #fff; font-weight: 600; border-bottom: 2px solid #7cc4fa; }
header nav { display: flex; gap: 1rem; flex: 1; }
.brand { font-weight: 700; letter-spacing: .04em; }
#live-status { font-size: .85em; padding: .1rem .5rem; border-radius: 1rem; }
.live-on { background: #2f8132; } .live-off { background: #7b8794; }
.clock { font-size: .85em; color: #fadb5f; }
main { padding: .8rem 1.2rem 2rem; }
h1 { font-size: 1.25rem; margin: .2rem 0 .6rem; word-break: break-all; }
h2 { font-size: 1.05rem; margin: 1.2rem 0 .3rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: .3rem 0 1rem; min-width: 40%; }
th, td { border-bottom: 1px solid var(--line); padding: .25rem .55rem; text-align: left; vertical-align: top; }
th { background: var(--bg); font-weight: 600; white-space: nowrap; }
td.num, th.num { text-align: right; }
code, .id, pre { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .9em; }
time { white-space: nowrap; } time .rel { color: var(--muted); }
pre.json { background: var(--bg); padding: .6rem; border: 1px solid var(--line); overflow: auto; max-height: 30rem; }
dl { display: grid; grid-template-columns: max-content auto; gap: .15rem 1rem; margin: .3rem 0 1rem; }
dt { font-weight: 600; color: var(--muted); }
.state { padding: 0 .4rem; border-radius: .3rem; background: #e4e7eb; white-space: nowrap; }
.s-running, .s-armed, .s-active { background: #d0ebff; } .s-waiting, .s-parked { background: #fff3c4; }
.s-completed, .s-fired, .s-routed, .s-accepted { background: #d3f9d8; }
.s-failed, .s-invalid, .s-refused { background: #ffd8d8; } .s-cancelled { background: #e4e7eb; color: #52606d; }
.held, .late, .error { color: #b3261e; font-weight: 600; }
.counts { display: flex; flex-wrap: wrap; gap: .4rem; margin: .2rem 0 .6rem; padding: 0; list-style: none; }
.counts a { display: inline-block; padding: .15rem .55rem; border: 1px solid var(--line); border-radius: 1rem; text-decoration: none; color: inherit; }
.counts a[aria-current] { background: #1f2933; color: #fff; }
form.filters { display: flex; flex-wrap: wrap; gap: .6rem; align-items: end; margin: .3rem 0 .6rem; }
form.filters label { display: flex; flex-direction: column; font-size: .85em; color: var(--muted); }
input, select, button { font: inherit; padding: .2rem .45rem; }
.actions { display: flex; flex-wrap: wrap; gap: .5rem; align-items: center; margin: .3rem 0 .8rem; }
button.act { border: 1px solid #52606d; background: #fff; border-radius: .3rem; cursor: pointer; }
button.act-cancel, button.act-interrupt, button.act-cancel_timer { border-color: #b3261e; color: #b3261e; }
#flash:empty { display: none; }
#flash { padding: .35rem .6rem; border-radius: .3rem; margin: .3rem 0; }
#flash.done { background: #d3f9d8; } #flash.failed { background: #ffd8d8; }
.note, .empty { color: var(--muted); }
.pager { display: flex; gap: 1rem; }
"""
