// The job page (#/job/ID): title and state, facts, why it is placed (or waits), where it
// runs drawn by pod and rack, cost, per-rank step times, the timeline and the live log.
// Live: re-fetches when the stream names the job (or says all) and every 5 s.

import * as api from "./api.js";
import { h, card } from "./dom.js";
import { stateClass } from "./format.js";
import { Refresher } from "./live.js";
import * as parts from "./jobparts.js";
import { LogView } from "./joblogs.js";
import * as topology from "./topology.js";

const POLL_MS = 5000;
const LOG_POLL_MS = 2000;
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

function canCancel(me, job) {
  if (TERMINAL.has(job.state)) return false;
  return me.role === "admin" || (me.role === "member" && me.team === job.team);
}

// The sections, built once the job has been fetched.
function buildSections() {
  const section = (title, testid) => {
    const body = h("div", { testid, className: "section-body" });
    return { body, box: card(title, null, body) };
  };
  return {
    title: h("h1", { testid: "job-title", className: "job-title" }),
    state: h("span", { testid: "job-state" }),
    actions: h("span", { className: "actions" }),
    facts: h("div"),
    explanation: section("Why", "job-explanation"),
    placement: section("Placement", "job-placement"),
    cost: section("Cost", "job-cost"),
    ranks: section("Step time per rank", "job-ranks"),
    timeline: section("Timeline", "job-timeline"),
  };
}

function layout(s, logs) {
  return [
    card(null, { className: "card job-head" },
      h("div", { className: "title-row" }, s.title, s.state, s.actions), s.facts),
    h("div", { className: "columns" },
      h("div", { className: "col" }, s.explanation.box, s.placement.box),
      h("div", { className: "col" }, s.cost.box, s.ranks.box)),
    s.timeline.box,
    card("Logs (last 200 lines)", null, logs.el),
  ];
}

export function mount(root, jobId, ctx) {
  let destroyed = false;
  let sections = null;
  let job = null;
  const logs = new LogView(jobId, ctx);

  function cancelButton() {
    const confirmBox = h("span", { className: "confirm", hidden: true }, "Cancel this job? ",
      h("button", { type: "button", className: "button small danger", testid: "job-cancel-confirm",
        onclick: () => cancelJob() }, "Yes, cancel"),
      h("button", { type: "button", className: "button small ghost",
        onclick: () => { confirmBox.hidden = true; } }, "No"));
    const button = h("button", { type: "button", className: "button small danger", testid: "job-cancel",
      onclick: () => { confirmBox.hidden = false; } }, "Cancel job");
    return [button, confirmBox];
  }

  async function cancelJob() {
    try {
      await api.post(`/v1/jobs/${api.seg(jobId)}/cancel`);
      refresher.request();
    } catch (err) {
      ctx.showError(err);
    }
  }

  function draw(detail, rankPage, hostIndex) {
    if (!sections) {
      sections = buildSections();
      root.append(...layout(sections, logs));
    }
    const s = sections;
    const wasCancellable = job && canCancel(ctx.me, job);
    job = detail;
    s.title.replaceChildren(detail.name, h("span", { className: "muted job-id" }, ` ${detail.id}`));
    s.state.className = stateClass(detail.state) + " big";
    s.state.textContent = detail.state;
    if (!s.actions.firstChild || wasCancellable !== canCancel(ctx.me, detail)) {
      s.actions.replaceChildren(...(canCancel(ctx.me, detail) ? cancelButton() : []));
    }
    s.facts.replaceChildren(parts.facts(detail));
    s.explanation.body.replaceChildren(...parts.explanation(detail));
    s.placement.body.replaceChildren(...parts.placement(detail, hostIndex));
    s.cost.body.replaceChildren(...parts.cost(detail));
    s.ranks.body.replaceChildren(...parts.ranks(rankPage));
    s.timeline.body.replaceChildren(...parts.timeline(detail.events));
    document.title = `${detail.name} (${detail.state}) · Boltforge`;
  }

  async function fetchRanks() {
    try {
      return await api.get(`/v1/jobs/${api.seg(jobId)}/ranks`);
    } catch (err) {
      if (err.status !== 404) ctx.showError(err);
      return null;
    }
  }

  async function fetchHosts(detail) {
    try {
      return await topology.hostIndex(detail.placement.map((p) => p.node));
    } catch (_) {
      return null;
    }
  }

  async function load() {
    let detail;
    try {
      detail = await api.get(`/v1/jobs/${api.seg(jobId)}`);
    } catch (err) {
      if (destroyed) return;
      ctx.showError(err);
      // Forbidden or missing: draw nothing and stop asking.
      if (!sections && (err.status === 403 || err.status === 404)) refresher.stop();
      return;
    }
    const [rankPage, hostIndex] = await Promise.all([fetchRanks(), fetchHosts(detail)]);
    if (destroyed) return;
    draw(detail, rankPage, hostIndex);
    logRefresher.request();
  }

  async function loadLogs() {
    if (!sections || destroyed) return;
    try {
      await logs.load();
    } catch (err) {
      if (!destroyed) ctx.showError(err);
    }
  }

  const refresher = new Refresher(load).every(POLL_MS);
  const logRefresher = new Refresher(loadLogs, 1000);
  const logTimer = setInterval(() => {
    if (job && !TERMINAL.has(job.state)) logRefresher.request();
  }, LOG_POLL_MS);
  refresher.request();

  const named = (ids) => ids.has(jobId) || [...ids].some((id) => id.startsWith(`${jobId}_`));
  return {
    onChange(change) {
      if (change.all || named(change.jobs)) refresher.request();
      else if (named(change.logs)) logRefresher.request();
    },
    destroy() {
      destroyed = true;
      refresher.stop();
      logRefresher.stop();
      clearInterval(logTimer);
      document.title = "Boltforge Fleet Console";
    },
  };
}
