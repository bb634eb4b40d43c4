// The queue page (#/queue): waiting jobs in queue order with position, reason and estimated
// start (running ones on request), filters by team and priority, and other teams' work in
// aggregate.

import * as api from "./api.js";
import { h, card, table, empty, emptyRow } from "./dom.js";
import { gpuAmount, num, position } from "./format.js";
import { Refresher } from "./live.js";
import * as cells from "./jobcells.js";

const POLL_MS = 5000;
const MAX_ROWS = 10000; // the API's largest page: every job of a busy queue
const VIEWS = {
  live: "",
  waiting: "pending,requeued",
  running: "scheduled,running,preempting",
};

function row(job) {
  const waiting = job.state === "pending" || job.state === "requeued";
  const start = waiting ? cells.timeCell(job.estimated_start)
    : cells.timeCell(job.started_at, "-");
  return cells.jobRow("queue-row", job, [
    h("td", { className: "num" }, position(job.position)),
    cells.jobCell(job),
    h("td", null, job.team),
    cells.priorityCell(job),
    cells.stateCell(job.state),
    h("td", { className: "num" }, gpuAmount(job, false)),
    h("td", { className: "reason" }, waiting ? (job.reason || "-") : (job.nodes || "-")),
    start,
  ]);
}

function othersTable(others) {
  if (!others.length) return empty("No other teams' work is hidden from you.");
  const t = table("queue-others-table", ["Team", "Pending", "Running", "GPUs"]);
  t.tbody.append(...others.map((o) => h("tr", { dataset: { team: o.team } },
    h("td", null, o.team), h("td", { className: "num" }, o.pending),
    h("td", { className: "num" }, o.running), h("td", { className: "num" }, o.gpus))));
  return t.wrap;
}

export function mount(root, _arg, ctx) {
  let destroyed = false;
  let signature = "";
  const filters = { team: "", priority: "", view: "waiting" };
  const teams = new Set(ctx.me.team ? [ctx.me.team] : []);
  const t = table("queue-table", ["Pos", "Job", "Team", "Priority", "State", "GPUs",
    "Reason / nodes", "Start"]);
  const counts = h("p", { className: "muted counts" });
  const others = h("div", { testid: "queue-others" });
  const setFilter = (key) => (value) => { filters[key] = value; signature = ""; refresher.request(); };
  const team = cells.select("queue-team", "Team", [["", "all teams"]], setFilter("team"));
  const prio = cells.select("queue-priority", "Priority",
    [["", "all priorities"], ...cells.PRIORITIES.map((p) => [p, p])], setFilter("priority"));
  const view = cells.select("queue-view", "Show",
    [["waiting", "waiting"], ["running", "running"], ["live", "waiting and running"]], setFilter("view"));

  function draw(reply) {
    for (const job of reply.jobs) teams.add(job.team);
    for (const o of reply.others) teams.add(o.team);
    cells.syncOptions(team.el, teams);
    const jobs = reply.jobs.filter((j) => !filters.priority || j.priority_name === filters.priority);
    const waiting = jobs.filter((j) => j.state === "pending" || j.state === "requeued");
    counts.textContent = `${jobs.length} job(s): ${waiting.length} waiting, ` +
      `${jobs.length - waiting.length} running or starting; ` +
      `${num(waiting.reduce((n, j) => n + j.gpus, 0))} GPUs wanted`;
    t.tbody.replaceChildren(...jobs.map(row));
    if (!jobs.length) t.tbody.append(emptyRow(8, "No jobs here."));
    others.replaceChildren(othersTable(reply.others));
  }

  async function load() {
    const params = new URLSearchParams({ limit: String(MAX_ROWS) });
    if (VIEWS[filters.view]) params.set("state", VIEWS[filters.view]);
    if (filters.team) params.set("team", filters.team);
    try {
      const reply = await api.get(`/v1/jobs?${params}`);
      // Skip identical replies, but redraw now and then so relative times stay fresh.
      const sig = JSON.stringify(reply) + Math.floor(Date.now() / 15000);
      if (destroyed || sig === signature) return;
      signature = sig;
      draw(reply);
    } catch (err) {
      if (!destroyed) ctx.showError(err);
    }
  }

  const refresher = new Refresher(load).every(POLL_MS);
  root.append(
    card("Queue", null, h("div", { className: "toolbar" }, team.box, prio.box, view.box), counts, t.wrap),
    card("Other teams", null, others));
  refresher.request();
  return {
    onChange(change) { if (change.state) refresher.request(); },
    destroy() { destroyed = true; refresher.stop(); },
  };
}
