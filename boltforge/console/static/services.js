// The services page (#/services): every inference service the caller may see, one row each:
// its replicas (wanted by the autoscaler, live, running, ready, and the min-max range), its
// load as the autoscaler last read it (requests/s, queued, p99, KV cache), its latency SLO
// and whether it is met, why and when the autoscaler last changed the count, and links to
// its replica jobs. The change feed names no services, so the page also re-reads every few
// seconds (load moves without any job changing).

import * as api from "./api.js";
import { h, card } from "./dom.js";
import { absTime, num, pct, relTime } from "./format.js";
import { Refresher } from "./live.js";

const POLL_MS = 3000;
const MAX_JOB_LINKS = 4;

// Two header rows: "Replicas" and "Load" span their columns.
function header() {
  const group = (label, span) => h("th", { colspan: span, className: "group" }, label);
  const plain = (label, title) => h("th", { rowspan: 2, title }, label);
  const sub = (label, title) => h("th", { className: "num", title }, label);
  return h("thead", null,
    h("tr", null, plain("Service"), group("Replicas", 5), group("Load", 4),
      plain("p99 SLO", "the service's latency_slo_ms, and whether the p99 meets it"),
      plain("Last scaled", "why the autoscaler last changed the count, and when"),
      plain("Replica jobs")),
    h("tr", null,
      sub("wanted", "replicas the autoscaler asks for"),
      sub("live", "replica jobs waiting or holding GPUs"),
      sub("running", "replica jobs running"),
      sub("ready", "running and reporting load"),
      sub("range", "min-max replicas"),
      sub("req/s", "requests per second, summed over the replicas"),
      sub("queued", "requests waiting, summed"),
      sub("p99", "the worst replica's p99 latency"),
      sub("KV cache", "the worst replica's KV-cache use")));
}

// "1 change", "3 changes".
function plural(count, word) {
  return `${count} ${word}${count === 1 ? "" : "s"}`;
}

function numCell(testid, text, title) {
  return h("td", { className: "num", testid, title }, text);
}

function nameCell(s) {
  return h("td", { className: "service-cell" },
    h("div", { className: "service-name", testid: "service-name" }, s.name),
    h("div", { className: "muted" }, s.team),
    s.state === "active" ? null : h("span", { className: "badge warn" }, s.state));
}

// Wanted, live, running, ready and the range; a shortfall (live or ready below wanted) warns.
function replicaCells(s) {
  const cls = (n) => (n < s.desired ? "num short" : "num");
  return [
    numCell("service-wanted", s.desired),
    h("td", { className: cls(s.live), testid: "service-live" }, s.live),
    numCell("service-running", s.running),
    h("td", { className: cls(s.ready), testid: "service-ready" }, s.ready),
    numCell("service-range", `${s.min_replicas}-${s.max_replicas}`),
  ];
}

function loadCells(s) {
  const load = s.load;
  if (!load) {
    return [h("td", { colspan: 4, className: "muted", testid: "service-load" }, "no load read yet")];
  }
  const read = `read ${relTime(load.at)} from ${load.reporting} report(s)`;
  return [
    numCell("service-rps", num(load.requests_per_s, 1), read),
    numCell("service-queued", num(load.queued, 0), read),
    numCell("service-p99", load.p99_ms === null ? "-" : `${num(load.p99_ms, 0)} ms`, read),
    numCell("service-kv", pct(load.kv_cache), read),
  ];
}

// "none" (no SLO), "unknown" (no p99 reported yet), "met" or "missed".
function sloState(s) {
  if (s.latency_slo_ms === null) return "none";
  return s.slo_met === null ? "unknown" : s.slo_met ? "met" : "missed";
}

// The SLO and a met / missed / unknown badge (unknown: no p99 reported yet).
function sloCell(s) {
  if (s.latency_slo_ms === null) return h("td", { className: "muted", testid: "service-slo" }, "none");
  const word = sloState(s);
  return h("td", { testid: "service-slo" },
    `≤ ${num(s.latency_slo_ms, 0)} ms `,
    h("span", { className: `badge slo-${word}`, testid: "slo-badge" }, word));
}

function scaledCell(s) {
  const when = s.scaled_at === null ? "never" : relTime(s.scaled_at);
  return h("td", { className: "reason", testid: "service-reason" },
    h("div", null, s.reason || "-"),
    h("div", { className: "muted", title: absTime(s.scaled_at) },
      `${when} · ${plural(s.scale_events, "change")}`));
}

// Links to the first few replica jobs (the job page), then how many more.
function jobsCell(s) {
  const ids = s.replica_jobs;
  const links = ids.slice(0, MAX_JOB_LINKS).map((id) =>
    h("a", { href: `#/job/${encodeURIComponent(id)}`, testid: "replica-link", className: "replica-link" }, id));
  const more = ids.length > MAX_JOB_LINKS
    ? h("span", { className: "muted nowrap", title: ids.slice(MAX_JOB_LINKS).join(", ") },
      `+${ids.length - MAX_JOB_LINKS} more`)
    : null;
  return h("td", { className: "replica-jobs" }, ids.length ? [...links, more] : h("span", { className: "muted" }, "none"));
}

function row(s) {
  return h("tr", { testid: "service-row", dataset: { service: s.name, slo: sloState(s) } },
    nameCell(s), replicaCells(s), loadCells(s), sloCell(s), scaledCell(s), jobsCell(s));
}

// One line over the table: services, replicas ready against wanted, SLOs missed.
function summaryText(services) {
  const wanted = services.reduce((n, s) => n + s.desired, 0);
  const ready = services.reduce((n, s) => n + s.ready, 0);
  const missed = services.filter((s) => s.slo_met === false).length;
  return `${plural(services.length, "service")} · ${ready} of ${plural(wanted, "wanted replica")} ` +
    `ready · ${missed} missing their SLO`;
}

function emptyState() {
  return h("div", { className: "empty-state", testid: "services-empty" },
    h("p", null, "No inference services are running."),
    h("p", { className: "muted" }, "Start one from a service spec (",
      h("code", null, "kind: service"), ") with ", h("code", null, "bolt serve service.yaml"),
      "; its replicas, load and SLO show here."));
}

export function mount(root, _arg, ctx) {
  let destroyed = false;
  let signature = "";
  const tbody = h("tbody");
  const tbl = h("table", { className: "data services", testid: "services-table" }, header(), tbody);
  const wrap = h("div", { className: "table-wrap" }, tbl);
  const counts = h("p", { className: "muted counts", testid: "services-summary" });
  const empty = emptyState();

  function draw(services) {
    const none = services.length === 0;
    wrap.hidden = none;
    counts.hidden = none;
    empty.hidden = !none;
    counts.textContent = summaryText(services);
    tbody.replaceChildren(...services.map(row));
  }

  async function load() {
    try {
      const reply = await api.get("/v1/services");
      const sig = JSON.stringify(reply) + Math.floor(Date.now() / 5000);
      if (destroyed || sig === signature) return;
      signature = sig;
      draw(reply.services);
    } catch (err) {
      if (!destroyed) ctx.showError(err);
    }
  }

  wrap.hidden = true;
  empty.hidden = true;
  const refresher = new Refresher(load, 1000).every(POLL_MS);
  root.append(card("Services", null, counts, empty, wrap));
  refresher.request();
  return {
    onChange(change) { if (change.state) refresher.request(); },
    destroy() { destroyed = true; refresher.stop(); },
  };
}
