// Helpers shared by the pages; everything they show comes from the REST API (/api).
"use strict";

async function api(path, options) {
  const response = await fetch(path, options);
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail || detail; } catch (e) { /* not JSON */ }
    throw new Error(`${response.status}: ${detail}`);
  }
  return response;
}

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) =>
    ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function pill(state, extra) {
  return `<span class="pill ${esc(extra || state)}">${esc(state)}</span>`;
}

function ago(unixSeconds) {
  const s = Math.max(0, Date.now() / 1000 - unixSeconds);
  if (s < 60) return `${s.toFixed(0)} s ago`;
  if (s < 3600) return `${(s / 60).toFixed(0)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

function clock(unixSeconds) {
  return new Date(unixSeconds * 1000).toLocaleTimeString();
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 1) return `${(seconds * 1000).toFixed(0)} ms`;
  if (seconds < 120) return `${seconds.toFixed(2)} s`;
  return `${(seconds / 60).toFixed(1)} min`;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}

function count(n) {
  return Number(n).toLocaleString();
}

function progressBar(done, running, total) {
  const d = total ? (100 * done) / total : 100;
  const r = total ? (100 * running) / total : 0;
  return `<div class="bar" title="${done} done, ${running} running of ${total}">` +
    `<span class="done" style="width:${d}%"></span>` +
    `<span class="run" style="left:${d}%;width:${r}%"></span></div>` +
    `<div class="bar-label">${done}/${total} tasks${running ? `, ${running} running` : ""}</div>`;
}

function stamp(id) {
  document.getElementById(id).textContent = `updated ${new Date().toLocaleTimeString()}`;
}

// Poll `refresh` every `interval` ms while it returns true (it returns false once nothing
// can change any more, e.g. a finished job).
function poll(refresh, interval) {
  async function tick() {
    let again = true;
    try {
      again = await refresh();
    } catch (e) {
      console.error(e);
    }
    if (again) setTimeout(tick, interval);
  }
  tick();
}
