// The cluster page: counts, every executor (lost ones with when and why), every job.
"use strict";

function card(n, label, cls) {
  return `<div class="card ${cls || ""}"><div class="n">${esc(n)}</div>` +
    `<div class="l">${esc(label)}</div></div>`;
}

function why(e) {
  if (e.state === "lost") {
    return `<span class="reason">${esc(e.reason)}</span>` +
      (e.detail ? `<div class="detail">${esc(e.detail)}</div>` : "");
  }
  if (e.quarantined_until) {
    return `<span class="reason">quarantined until ${esc(clock(e.quarantined_until))}</span>` +
      `<div class="detail">${esc(e.quarantine)}</div>`;
  }
  if (e.slow_link_since && e.state === "alive") {
    return `<span class="reason">slow link since ${esc(clock(e.slow_link_since))}</span>` +
      `<div class="detail">no new task until ${esc(clock(e.slow_link_until))}: ` +
      `${esc(e.slow_link)}</div>`;
  }
  if (e.lagging_since) {
    return `<span class="reason">lagging since ${esc(clock(e.lagging_since))}</span>` +
      `<div class="detail">its commands are held up (a cut link's retries?): no new task, ` +
      `its tasks copied${e.streams_moved ? `; stream moved ${esc(e.streams_moved)}×` : ""}` +
      `</div>`;
  }
  if (e.suspected_since) {
    return `<span class="reason">suspected since ${esc(clock(e.suspected_since))}</span>` +
      `<div class="detail">silent for ${e.heartbeat_age_s.toFixed(1)} s: no new task</div>`;
  }
  if (e.excluded_until) {
    return `<span class="reason">excluded until ${esc(clock(e.excluded_until))}</span>` +
      `<div class="detail">${esc(e.exclusion)}</div>`;
  }
  if (e.slow && e.state === "alive") {
    return `<span class="reason">slow</span><div class="detail">its tasks took ` +
      `${esc(e.slowness.toFixed(1))}× their stages' median</div>`;
  }
  if (e.heartbeat_age_s >= 2) {
    return `<span class="reason">silent for ${e.heartbeat_age_s.toFixed(0)} s</span>`;
  }
  if (e.unhealthy) {  // takes no task: its work directory is full
    return `<span class="reason">unhealthy</span><div class="detail">${esc(e.unhealthy)}</div>`;
  }
  return e.detail ? `<span class="detail">${esc(e.detail)}</span>` : "";
}

function executorRow(e) {
  const usable = e.state === "alive" || e.state === "draining";
  return `<tr class="state-${esc(e.state)}" data-executor="${esc(e.id)}">` +
    `<td><code>${esc(e.id)}</code></td>` +
    `<td class="state">${pill(e.state)}</td>` +
    `<td title="${esc(new Date(e.since * 1000).toString())}">${esc(clock(e.since))}` +
    `<div class="detail">${esc(ago(e.since))}</div></td>` +
    `<td class="why">${why(e)}</td>` +
    `<td><code>${esc(e.flight_address)}</code></td>` +
    `<td>${esc(e.pid || "")}</td>` +
    `<td class="num">${esc(e.slots)}</td>` +
    `<td class="num">${usable ? esc(e.running_tasks) : "–"}</td>` +
    `<td class="num">${usable ? esc(bytes(e.shuffle_bytes_held)) : "–"}</td>` +
    `<td class="num">${usable ? esc(duration(e.heartbeat_age_s)) + " ago" : "–"}</td></tr>`;
}

// The query on one line, without its leading comments.
function oneLine(sql) {
  const lines = sql.split("\n").filter((l) => !/^\s*--/.test(l));
  return lines.join(" ").replace(/\s+/g, " ").trim();
}

function jobRow(j) {
  const trouble = j.state === "failed" ? " problem" : "";
  return `<tr class="job${trouble}" data-job="${esc(j.id)}">` +
    `<td><a href="/jobs/${encodeURIComponent(j.id)}"><code>${esc(j.id)}</code></a></td>` +
    `<td class="state">${pill(j.state)}</td>` +
    `<td class="owner">${esc(j.owner)}</td>` +
    `<td>${esc(clock(j.submitted_at))}</td>` +
    `<td>${progressBar(j.tasks_done, j.tasks_running, j.tasks_total)}</td>` +
    `<td class="num">${esc(duration(j.elapsed_s))}</td>` +
    `<td class="num">${esc(count(j.rows))}</td>` +
    `<td class="num">${esc(j.tasks_rerun)}</td>` +
    `<td class="num">${esc(j.outputs_recomputed)}</td>` +
    `<td class="sql" title="${esc(j.sql)}">${esc(oneLine(j.sql))}</td></tr>`;
}

async function refresh() {
  const [cluster, executors, jobs] = await Promise.all([
    api("/api/cluster").then((r) => r.json()),
    api("/api/executors").then((r) => r.json()),
    api("/api/jobs").then((r) => r.json()),
  ]);
  document.getElementById("scheduler").textContent = `scheduler ${cluster.scheduler_address}`;
  const ex = cluster.executors;
  document.getElementById("cards").innerHTML =
    card(ex.alive || 0, "executors alive", "alive") +
    card(ex.draining || 0, "draining", "draining") +
    card(ex.lost || 0, "lost", "lost") +
    card(cluster.slots, "slots") +
    card(cluster.running_tasks, "tasks running", "running") +
    card(cluster.jobs.running || 0, "jobs running", "running") +
    card(cluster.jobs.succeeded || 0, "jobs succeeded", "alive") +
    card(cluster.jobs.failed || 0, "jobs failed", "lost");
  document.querySelector("#executors tbody").innerHTML = executors.length
    ? executors.map(executorRow).join("")
    : `<tr><td colspan="10" class="detail">no executor has registered</td></tr>`;
  document.querySelector("#jobs tbody").innerHTML = jobs.length
    ? jobs.map(jobRow).join("")
    : `<tr><td colspan="10" class="detail">no job yet</td></tr>`;
  stamp("updated");
  return true;
}

poll(refresh, 1000);
