// The jobs page (#/jobs): every job the caller may see, finished ones included, most recent
// first, with filters by state and team and a text search.

import * as api from "./api.js";
import { h, card, table, emptyRow } from "./dom.js";
import { duration, gpuAmount } from "./format.js";
import { Refresher } from "./live.js";
import * as cells from "./jobcells.js";

const ALL_STATES = ["pending", "requeued", "scheduled", "running", "preempting",
  "succeeded", "failed", "cancelled"];
const POLL_MS = 10000;
const MAX_ROWS = 500;

function runtime(job) {
  if (!job.started_at) return "-";
  const end = job.finished_at || Date.now() / 1000;
  return duration(end - job.started_at);
}

function row(job) {
  return cells.jobRow("job-row", job, [
    cells.jobCell(job),
    h("td", null, job.team),
    h("td", null, job.user || "-"),
    cells.priorityCell(job),
    cells.stateCell(job.state),
    h("td", { className: "num" }, gpuAmount(job, false)),
    cells.timeCell(job.submitted_at, "-"),
    h("td", null, runtime(job)),
    h("td", { className: "num" }, job.preemptions || 0),
    h("td", { className: "reason" }, job.nodes || job.reason || "-"),
  ]);
}

function recentFirst(a, b) {
  const byId = String(b.id).localeCompare(String(a.id), undefined, { numeric: true });
  return (b.submitted_at - a.submitted_at) || byId;
}

function matches(job, filters) {
  if (filters.state && job.state !== filters.state) return false;
  if (!filters.text) return true;
  const hay = `${job.id} ${job.name} ${job.user} ${job.project || ""}`.toLowerCase();
  return hay.includes(filters.text.toLowerCase());
}

export function mount(root, _arg, ctx) {
  let destroyed = false;
  let signature = "";
  let lastJobs = [];
  const filters = { state: "", team: "", text: "" };
  const teams = new Set(ctx.me.team ? [ctx.me.team] : []);
  const t = table("jobs-table", ["Job", "Team", "User", "Priority", "State", "GPUs",
    "Submitted", "Runtime", "Preempted", "Nodes / reason"]);
  const counts = h("p", { className: "muted counts" });
  const state = cells.select("jobs-state", "State",
    [["", "all states"], ...ALL_STATES.map((s) => [s, s])], (v) => { filters.state = v; draw(); });
  const team = cells.select("jobs-team", "Team", [["", "all teams"]],
    (v) => { filters.team = v; signature = ""; refresher.request(); });
  const search = h("input", { testid: "jobs-search", type: "search", placeholder: "id, name, user",
    oninput: () => { filters.text = search.value.trim(); draw(); } });

  function draw() {
    const shown = lastJobs.filter((j) => matches(j, filters));
    counts.textContent = shown.length > MAX_ROWS
      ? `${shown.length} job(s); showing the ${MAX_ROWS} most recent (filter to narrow)`
      : `${shown.length} job(s)`;
    t.tbody.replaceChildren(...shown.slice(0, MAX_ROWS).map(row));
    if (!shown.length) t.tbody.append(emptyRow(10, "No jobs."));
  }

  async function load() {
    const params = new URLSearchParams({ state: ALL_STATES.join(","), limit: "10000" });
    if (filters.team) params.set("team", filters.team);
    try {
      const reply = await api.get(`/v1/jobs?${params}`);
      const sig = JSON.stringify(reply.jobs) + Math.floor(Date.now() / 15000);
      if (destroyed || sig === signature) return;
      signature = sig;
      for (const job of reply.jobs) teams.add(job.team);
      cells.syncOptions(team.el, teams);
      lastJobs = reply.jobs.slice().sort(recentFirst);
      draw();
    } catch (err) {
      if (!destroyed) ctx.showError(err);
    }
  }

  const refresher = new Refresher(load, 1000).every(POLL_MS);
  root.append(card("Jobs", null,
    h("div", { className: "toolbar" }, state.box, team.box,
      h("label", { className: "filter" }, "Search", search)),
    counts, t.wrap));
  refresher.request();
  return {
    onChange(change) { if (change.state) refresher.request(); },
    destroy() { destroyed = true; refresher.stop(); },
  };
}
