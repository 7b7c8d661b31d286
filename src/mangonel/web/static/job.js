// The job page: facts, stage graph (SVG from the API), stages, task attempts, cancel.
"use strict";

const jobId = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
const FINISHED = new Set(["succeeded", "failed", "cancelled"]);
let lastJob = null;

function fact(n, label, cls) {
  return `<div class="card ${cls || ""}"><div class="n">${esc(n)}</div>` +
    `<div class="l">${esc(label)}</div></div>`;
}

function reads(s) {
  const parts = [];
  if (s.scan_table) parts.push(`table <code>${esc(s.scan_table)}</code>`);
  for (const t of s.side_tables || []) parts.push(`table <code>${esc(t)}</code> (whole)`);
  for (const t of s.ranged_tables || []) {
    parts.push(`table <code>${esc(t)}</code> (by key range)`);
  }
  for (const i of s.inputs) {
    const how = i.mode === "partition" ? "hash exchange" : (s.num_tasks > 1 ? "broadcast" : "gather");
    parts.push(`stage ${esc(i.stage)} (${esc(how)})`);
  }
  return parts.join("<br>");
}

function stageRow(s) {
  const trouble = s.failed || s.lost || s.tasks_rerun || s.outputs_recomputed ? " problem" : "";
  return `<tr class="stage${trouble}" data-stage="${esc(s.id)}">` +
    `<td><b>${esc(s.id)}</b>${s.final ? " (result)" : ""}<div class="detail">${esc(s.label)}</div></td>` +
    `<td>${progressBar(Math.min(s.done, s.num_tasks), s.running, s.num_tasks)}` +
    (s.planned_tasks != null
      ? `<div class="detail coalesced" title="adaptive execution: each task read a range of ` +
        `the hash partitions, from their real sizes">${esc(s.num_tasks)} of ` +
        `${esc(s.planned_tasks)} planned tasks (coalesced)</div>`
      : "") +
    `</td>` +
    `<td class="num">${esc(s.failed)}</td>` +
    `<td class="num">${esc(s.lost)}</td>` +
    `<td class="num">${esc(s.tasks_rerun)}</td>` +
    `<td class="num">${esc(s.outputs_recomputed)}</td>` +
    `<td class="num" title="speculative copies launched (won / lost)">${esc(s.speculated)}` +
    (s.speculated ? `<div class="detail">${esc(s.speculation_won)} won / ${esc(s.speculation_lost)} lost</div>` : "") +
    `</td>` +
    `<td class="num">${esc(count(s.rows))}</td>` +
    `<td class="num">${esc(bytes(s.bytes))}</td>` +
    `<td class="num">${esc(duration(s.elapsed_s))}</td>` +
    `<td>${reads(s)}</td>` +
    `<td class="detail">${esc(s.output)}</td>` +
    `<td><details><summary>SQL</summary><pre>${esc(s.sql)}</pre></details></td></tr>`;
}

// Where the time went: the colour of each part of a task's span, and of a slot's idle time.
const PARTS = [
  ["launch", "launch", "#9aa5b8", "the scheduler's launch to a slot starting the task"],
  ["setup", "setup", "#c9a227", "scan database, inputs registered"],
  ["fetch", "fetch", "#e08a1e", "upstream partitions: over Flight, or mapped on the host"],
  ["execute", "execute", "#2e9d57", "DuckDB running the stage's SQL"],
  ["write", "write", "#2f6fd6", "output partitions split, encoded, written"],
  ["cleanup", "cleanup", "#7a8494", "inputs unregistered, memory handed back"],
  ["other", "other", "#b8bec9", "on the slot outside the phases"],
  ["report", "report", "#6b4fbb", "the task's end to the scheduler having its report"],
  ["wasted", "wasted", "#d64545", "attempts that failed, were lost or cancelled"],
  ["idle_planning", "idle: planning", "#e3e6eb", "no task launched yet (planning, first commit)"],
  ["idle_barrier", "idle: barrier", "#f3d2a2", "another slot ran a task of the job"],
  ["idle_scheduler", "idle: scheduler", "#d9d2ee", "no slot ran one (between stages, at the end)"],
];

function drawBreakdown(b) {
  const box = document.getElementById("breakdown");
  if (!b || !b.capacity_s) { box.innerHTML = ""; return; }
  const segments = PARTS.filter(([key]) => b.seconds[key] > 0).map(([key, label, colour, why]) => {
    const share = (100 * b.seconds[key]) / b.capacity_s;
    return `<span class="seg" data-part="${esc(key)}" style="width:${share}%;background:${colour}" ` +
      `title="${esc(label)}: ${esc(duration(b.seconds[key]))} (${share.toFixed(0)}%): ${esc(why)}"></span>`;
  }).join("");
  const legend = PARTS.filter(([key]) => b.seconds[key] > 0)
    .sort((x, y) => b.seconds[y[0]] - b.seconds[x[0]])
    .map(([key, label, colour]) => `<span><i style="background:${colour}"></i>${esc(label)} ` +
      `${((100 * b.seconds[key]) / b.capacity_s).toFixed(0)}%</span>`).join("");
  box.innerHTML =
    `<div class="detail">${esc(b.slots)} slots × ${esc(duration(b.window_s))} ` +
    `(planning ${esc(duration(b.planning_s))}, then the job): what each slot did</div>` +
    `<div class="stack">${segments}</div><div class="legend wrap">${legend}</div>`;
}

function phaseRow(s) {
  const p = s.phases;
  const cell = (v) => `<td class="num">${esc(duration(v))}</td>`;
  const total = PARTS.slice(0, 8).reduce((sum, [key]) => sum + p[key + "_s"], 0);
  const bar = PARTS.slice(0, 8).filter(([key]) => p[key + "_s"] > 0).map(([key, label, colour]) =>
    `<span class="seg" style="width:${(100 * p[key + "_s"]) / total}%;background:${colour}" ` +
    `title="${esc(label)} ${esc(duration(p[key + "_s"]))}"></span>`).join("");
  return `<tr class="phase" data-stage="${esc(s.id)}"><td><b>${esc(s.id)}</b></td>` +
    `<td>${esc(p.tasks)} on ${esc(p.executors)} executor${p.executors === 1 ? "" : "s"}</td>` +
    cell(p.launch_s) + cell(p.setup_s) + cell(p.fetch_s) + cell(p.execute_s) + cell(p.write_s) +
    cell(p.cleanup_s + p.other_s) + cell(p.report_s) +
    `<td><div class="stack small">${bar}</div></td>` +
    `<td class="num">${esc(duration(p.task_max_s))} / ${esc(duration(p.task_median_s))}` +
    (p.skew >= 1.5 ? `<div class="detail">skew ${esc(p.skew.toFixed(1))}×</div>` : "") + `</td>` +
    `<td class="num">${esc(bytes(p.fetched_remote_bytes))} (${esc(bytes(p.fetched_local_bytes))})</td></tr>`;
}

function isProblem(a) {
  return a.kind !== "first" || a.state === "failed" || a.state === "lost" || a.output_lost;
}

function attemptRow(a) {
  const trouble = a.state === "failed" || a.state === "lost" ? " problem" : "";
  const reason = a.reason || (a.output_lost ? "its output was lost; made again by a later attempt" : "");
  return `<tr class="attempt${trouble}" data-kind="${esc(a.kind)}" data-state="${esc(a.state)}" ` +
    `data-output-lost="${a.output_lost}">` +
    `<td><code>s${esc(a.stage)}/p${esc(a.partition)}</code></td>` +
    `<td class="num">${esc(a.attempt)}</td>` +
    `<td>${pill(a.kind, "kind-" + a.kind)}</td>` +
    `<td><code>${esc(a.executor)}</code></td>` +
    `<td>${pill(a.state)}</td>` +
    `<td>${esc(clock(a.launched_at))}</td>` +
    `<td class="num"${a.phases ? ` title="${esc(PARTS.slice(0, 8).map(([key, label]) =>
      `${label} ${duration(a.phases[key + "_s"])}`).join(", "))}"` : ""}>${a.state === "running"
      ? `<span class="detail">${esc(duration(Math.max(0, Date.now() / 1000 - a.launched_at)))} so far</span>`
      : esc(duration(a.elapsed_s))}</td>` +
    `<td class="num">${a.state === "succeeded" ? esc(count(a.rows)) : ""}</td>` +
    `<td class="num">${a.state === "succeeded" ? esc(bytes(a.bytes)) : ""}</td>` +
    `<td class="why">${reason ? `<span class="detail">${esc(reason)}</span>` : ""}</td></tr>`;
}

function drawAttempts() {
  if (!lastJob) return;
  const only = document.getElementById("only-problems").checked;
  const shown = lastJob.attempts.filter((a) => !only || isProblem(a));
  const problems = lastJob.attempts.filter(isProblem).length;
  document.getElementById("attempt-count").textContent =
    `${lastJob.attempts.length} attempts, ${problems} of them failed, lost, re-run, ` +
    `recomputed or with a lost output` +
    (lastJob.attempts_not_kept ? `; ${lastJob.attempts_not_kept} more not kept` : "");
  document.querySelector("#attempts tbody").innerHTML = shown.length
    ? shown.map(attemptRow).join("")
    : `<tr><td colspan="10" class="detail">no attempt ${only ? "with a problem" : "yet"}</td></tr>`;
}

async function refresh() {
  let job;
  try {
    job = await api(`/api/jobs/${encodeURIComponent(jobId)}`).then((r) => r.json());
  } catch (e) {
    document.getElementById("error").innerHTML = `<div class="error">${esc(e.message)}</div>`;
    return false;
  }
  const svg = await api(`/api/jobs/${encodeURIComponent(jobId)}/graph.svg`).then((r) => r.text());
  lastJob = job;
  document.title = `mangonel · job ${job.id} · ${job.state}`;
  document.getElementById("job-id").textContent = job.id;
  document.getElementById("job-state").innerHTML = pill(job.state);
  document.getElementById("cancel").disabled = FINISHED.has(job.state);
  document.getElementById("facts").innerHTML =
    fact(`${(job.progress * 100).toFixed(0)}%`, "progress", "running") +
    fact(`${job.stages_done}/${job.stages_total}`, "stages done") +
    fact(`${job.tasks_done}/${job.tasks_total}`, "tasks done") +
    fact(duration(job.elapsed_s), FINISHED.has(job.state) ? "duration" : "running for") +
    fact(count(job.rows), "result rows") +
    fact(job.tasks_rerun, "tasks re-run", job.tasks_rerun ? "draining" : "") +
    fact(job.outputs_recomputed, "outputs recomputed", job.outputs_recomputed ? "draining" : "") +
    fact(job.speculated, "speculative copies", job.speculated ? "draining" : "") +
    fact(clock(job.submitted_at), "submitted");
  const tone = job.state === "cancelled" ? " notice" : "";
  document.getElementById("error").innerHTML = job.error
    ? `<div class="error${tone}"><b>${esc(job.error_type || "error")}</b>: ${esc(job.error)}</div>`
    : "";
  document.getElementById("graph").innerHTML = svg;
  document.querySelector("#stages tbody").innerHTML = job.stages.map(stageRow).join("");
  drawBreakdown(job.breakdown);
  const timed = job.stages.filter((s) => s.phases);
  document.querySelector("#phases tbody").innerHTML = timed.length
    ? timed.map(phaseRow).join("")
    : `<tr><td colspan="12" class="detail">no task has reported yet</td></tr>`;
  document.getElementById("sql").textContent = job.sql;
  drawAttempts();
  stamp("updated");
  return !FINISHED.has(job.state);
}

document.getElementById("only-problems").addEventListener("change", drawAttempts);
document.getElementById("cancel").addEventListener("click", async () => {
  if (!confirm(`Cancel job ${jobId}?`)) return;
  const button = document.getElementById("cancel");
  button.disabled = true;
  try {
    await api(`/api/jobs/${encodeURIComponent(jobId)}/cancel`, { method: "POST" });
  } catch (e) {
    document.getElementById("error").innerHTML = `<div class="error">${esc(e.message)}</div>`;
  }
  refresh();
});

poll(refresh, 1000);
