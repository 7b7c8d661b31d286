// Helpers shared by the pages; everything they show comes from the REST API (/api).
"use strict";

async function api(path, options) {
  // The token travels in the HttpOnly cookie /api/login set: same-origin fetches send it.
  const response = await fetch(path, { credentials: "same-origin", ...options });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail || detail; } catch (e) { /* not JSON */ }
    if (response.status === 401) showLogin(detail);  // the token expired, or was revoked
    throw new Error(`${response.status}: ${detail}`);
  }
  return response;
}

// ------------------------------------------------------------------ who is here

// Fills the header (the user, "log out", "insecure" without TLS) and shows the
// login form when the scheduler lets only known users in; resolves to whether
// the page may go on reading the API.
async function loadSession() {
  const session = await fetch("/api/session", { credentials: "same-origin" })
    .then((r) => r.json());
  const header = document.querySelector("header.top");
  if (!session.tls) {
    const badge = document.createElement("span");
    badge.className = "insecure";
    badge.id = "insecure";
    badge.textContent = "insecure";
    badge.title = "the scheduler serves without TLS: passwords, tokens and data cross " +
      "the network in clear text (start it with --tls-dir)";
    header.appendChild(badge);
  }
  if (session.login_required && session.authenticated) {
    const who = document.createElement("span");
    who.className = "meta who";
    who.id = "who";
    who.innerHTML = `${esc(session.user)}${session.admin ? " (admin)" : ""} · ` +
      `<a href="#" id="logout">log out</a>`;
    header.appendChild(who);
    document.getElementById("logout").addEventListener("click", async (event) => {
      event.preventDefault();
      await fetch("/api/logout", { method: "POST", credentials: "same-origin" });
      location.reload();
    });
  }
  if (session.login_required && !session.authenticated) {
    showLogin(session.problem);
    return false;
  }
  return true;
}

function showLogin(problem) {
  let form = document.getElementById("login");
  if (!form) {
    const main = document.querySelector("main");
    main.hidden = true;
    form = document.createElement("form");
    form.id = "login";
    form.className = "login";
    form.innerHTML =
      `<h1>Log in</h1>` +
      `<p class="detail">This scheduler lets only known users in.</p>` +
      `<label>User <input name="user" id="login-user" autocomplete="username"></label>` +
      `<label>Password <input name="password" id="login-password" type="password" ` +
      `autocomplete="current-password"></label>` +
      `<label>or a token <input name="token" id="login-token" autocomplete="off" ` +
      `placeholder="mgt1...."></label>` +
      `<button type="submit" id="login-submit">Log in</button>` +
      `<div class="error" id="login-error" hidden></div>`;
    main.parentNode.insertBefore(form, main);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const body = {
        user: form.user.value, password: form.password.value, token: form.token.value.trim(),
      };
      const response = await fetch("/api/login", {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      });
      if (response.ok) {
        location.reload();
        return;
      }
      let detail = response.statusText;
      try { detail = (await response.json()).detail || detail; } catch (e) { /* not JSON */ }
      showLoginError(detail);
    });
  }
  if (problem) showLoginError(problem);
}

function showLoginError(message) {
  const box = document.getElementById("login-error");
  box.textContent = message;
  box.hidden = false;
}

const sessionReady = loadSession().catch((e) => { console.error(e); return true; });

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
    if (!(await sessionReady)) return;  // the login form is shown; a login reloads the page
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
