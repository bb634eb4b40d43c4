// The job page's sections: facts, explanation, placement drawing, cost, per-rank step times
// and the timeline. Each function returns the nodes that go inside its card.

import { h, empty } from "./dom.js";
import { hBar } from "./charts.js";
import {
  absTime, colourOf, dollars, duration, gpuAmount, num, pct, position, relTime, seconds,
} from "./format.js";

const WAITING = new Set(["pending", "requeued"]);

function fact(label, value, title) {
  return h("div", { className: "fact" }, h("div", { className: "fact-label" }, label),
    h("div", { className: "fact-value", title }, value ?? "-"));
}

function timeFact(label, unixS) {
  return fact(label, unixS ? relTime(unixS) : "-", absTime(unixS));
}

// The facts grid under the title.
export function facts(job) {
  const ran = job.started_at ? duration((job.finished_at || Date.now() / 1000) - job.started_at) : "-";
  return h("div", { className: "facts-grid" },
    fact("Team", job.team), fact("User", job.user || "-"), fact("Project", job.project || "-"),
    fact("Priority", `${job.priority_name} (${job.priority})`),
    fact("GPUs", `${gpuAmount(job)} in ${job.replicas} replica(s)`),
    fact("Nodes", job.nodes || "-"),
    timeFact("Submitted", job.submitted_at), timeFact("Started", job.started_at),
    timeFact("Finished", job.finished_at), fact("Runtime", ran),
    fact("Queue position", position(job.position)),
    timeFact("Estimated start", job.estimated_start),
    fact("Preemptions", String(job.preemptions)), fact("Restarts", String(job.restarts)),
    fact("Last step", job.last_step ?? "-"), timeFact("Last checkpoint", job.last_checkpoint_at),
    fact("Epoch", String(job.epoch)), fact("Exit code", job.exit_code ?? "-"));
}

// Why it runs where it does, or why it waits.
export function explanation(job) {
  const waiting = WAITING.has(job.state);
  const lines = waiting ? job.waiting : job.explanation;
  const heading = waiting ? `Waiting${job.reason ? `: ${job.reason}` : ""}` : "Placement";
  const alt = waiting ? job.explanation : job.waiting;
  return [
    h("h3", null, heading),
    lines.length ? h("ul", { className: "reasons" }, lines.map((l) => h("li", null, l)))
      : empty(waiting ? "No waiting diagnosis yet." : "No placement explanation recorded."),
    !waiting || !alt.length ? null : h("details", null, h("summary", null, "Last placement"),
      h("ul", { className: "reasons" }, alt.map((l) => h("li", null, l)))),
  ].filter(Boolean);
}

// Host -> {gpus: Map(gpu -> rank), ranks: [rank]} for the job's replicas.
function gpusByHost(placement) {
  const hosts = new Map();
  for (const rep of placement) {
    const entry = hosts.get(rep.node) || { gpus: new Map(), ranks: [], states: new Set() };
    for (const g of rep.gpus) entry.gpus.set(g, rep.rank);
    entry.ranks.push(rep.rank);
    entry.states.add(rep.state);
    hosts.set(rep.node, entry);
  }
  return hosts;
}

function placementHost(name, entry, where, colour) {
  const count = Math.max(where ? where.gpus : 8, ...[...entry.gpus.keys()].map((g) => g + 1));
  const cells = [];
  for (let g = 0; g < count; g++) {
    const mine = entry.gpus.has(g);
    cells.push(h("span", {
      className: mine ? "gpu mine" : "gpu", style: mine ? { background: colour } : null,
      title: mine ? `GPU ${g}: rank ${entry.gpus.get(g)}` : `GPU ${g}: not this job's`,
    }, mine ? String(entry.gpus.get(g)) : ""));
  }
  return h("div", { className: "placement-host", testid: "placement-host", dataset: { host: name } },
    h("div", { className: "ph-name" }, name),
    h("div", { className: "ph-gpus" }, cells),
    h("div", { className: "ph-ranks muted" },
      `rank ${entry.ranks.sort((a, b) => a - b).join(", ")} · ${[...entry.states].join(", ")}`));
}

// The job's hosts grouped by pod and rack, its GPUs highlighted.
export function placement(job, hostIndex) {
  if (!job.placement.length) return [empty("Not placed.")];
  const hosts = gpusByHost(job.placement);
  const colour = colourOf(job.team);
  const pods = new Map();
  for (const [name, entry] of hosts) {
    const where = hostIndex ? hostIndex.get(name) : null;
    const pod = where ? where.pod : "?";
    const rack = where ? where.rack : "?";
    if (!pods.has(pod)) pods.set(pod, new Map());
    const racks = pods.get(pod);
    if (!racks.has(rack)) racks.set(rack, []);
    racks.get(rack).push(placementHost(name, entry, where, colour));
  }
  return [...pods].map(([pod, racks]) => h("div", { className: "ppod" },
    h("div", { className: "pod-label" }, `pod ${pod}`),
    h("div", { className: "racks" }, [...racks].map(([rack, els]) => h("div", { className: "prack" },
      h("div", { className: "rack-label" }, `rack ${rack}`), h("div", { className: "phosts" }, els))))));
}

// GPU-hours and dollars, allocated and productive.
export function cost(job) {
  const share = job.gpu_hours > 0 ? job.productive_gpu_hours / job.gpu_hours : null;
  return [h("div", { className: "facts-grid" },
    fact("GPU-hours (allocated)", num(job.gpu_hours, 2)),
    fact("Dollars (allocated)", dollars(job.dollars)),
    fact("GPU-hours (productive)", num(job.productive_gpu_hours, 2)),
    fact("Dollars (productive)", dollars(job.productive_dollars)),
    fact("Productive share", share === null ? "-" : pct(share)))];
}

function rankRow(rank, max, peer) {
  const colour = rank.straggler ? "#d64545" : "#3b82c4";
  const label = `rank ${rank.rank} · ${rank.node}`;
  const text = `${seconds(rank.median_s)}${rank.straggler ? " · straggler" : ""}`;
  return h("div", {
    testid: "rank-row", className: rank.straggler ? "rank-row straggler" : "rank-row",
    dataset: { rank: rank.rank, straggler: rank.straggler ? "true" : "false" },
  }, hBar({
    label, value: rank.median_s || 0, max, colour, text, mark: peer,
    title: `step ${rank.step} (${relTime(rank.at)}); median step ${seconds(rank.median_s)}` +
      (peer ? `; peer median ${seconds(peer)}` : ""),
  }));
}

// A bar per rank with its median step time; stragglers in red.
export function ranks(page) {
  if (!page || !page.ranks.length) return [empty("No progress reported by this allocation yet.")];
  const max = Math.max(...page.ranks.map((r) => r.median_s || 0), page.peer_median_s || 0) * 1.15 || 1;
  const stragglers = page.ranks.filter((r) => r.straggler).length;
  return [
    h("p", { className: "muted" }, `epoch ${page.epoch} · peer median ${seconds(page.peer_median_s)}` +
      ` · ${stragglers} straggler(s) · the tick marks the peer median`),
    h("div", { className: "rank-bars" }, page.ranks.map((r) => rankRow(r, max, page.peer_median_s))),
  ];
}

function eventEntry(event) {
  const dataset = { kind: event.kind, seq: event.seq };
  return h("li", { testid: "timeline-event", className: "event", dataset },
    h("span", { className: "event-time", title: absTime(event.at) }, relTime(event.at)),
    h("span", { className: "event-kind" }, event.kind),
    h("span", { className: "event-message" }, event.message));
}

// One entry per event, oldest first.
export function timeline(events) {
  if (!events.length) return [empty("No events yet.")];
  return [h("ol", { className: "timeline" }, events.map(eventEntry))];
}
