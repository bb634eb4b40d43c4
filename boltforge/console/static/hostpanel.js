// The fleet page's side panel for one host: state, health, a row per GPU, its jobs and,
// for admins, cordon / drain / uncordon.

import * as api from "./api.js";
import { h, itemsOr } from "./dom.js";
import {
  colourOf, FREE_COLOUR, gpuAmount, num, pct, relTime, absTime, stateClass,
} from "./format.js";
import { Refresher } from "./live.js";

const ACTIONS = [["cordon", "Cordon"], ["drain", "Drain"], ["uncordon", "Uncordon"]];

function fact(label, value, title) {
  return [h("dt", null, label), h("dd", { title }, value ?? "-")];
}

function gpuRow(slot) {
  const colour = slot.team ? colourOf(slot.team) : FREE_COLOUR;
  const job = slot.job
    ? h("a", { href: `#/job/${encodeURIComponent(slot.job)}` }, slot.job)
    : (slot.team ? "(other team)" : "free");
  return h("tr", { testid: "host-gpu", dataset: { index: slot.index, owner: slot.job || "" } },
    h("td", null, h("span", { className: "swatch", style: { background: colour } }), ` ${slot.index}`),
    h("td", null, job),
    h("td", null, slot.team || "-"),
    h("td", null, slot.rank ?? "-"),
    h("td", null, slot.utilization === null || slot.utilization === undefined ? "-" : pct(slot.utilization)),
    h("td", null, slot.memory_used_gb === null || slot.memory_used_gb === undefined
      ? "-" : `${num(slot.memory_used_gb, 1)} GB`));
}

function jobLink(job) {
  return h("li", null,
    h("a", { testid: "host-job", href: `#/job/${encodeURIComponent(job.id)}`, dataset: { job: job.id } },
      job.id),
    ` ${job.name} `,
    h("span", { className: stateClass(job.state) }, job.state),
    h("span", { className: "muted" }, ` ${job.team} · ${gpuAmount(job)}`));
}

export class HostPanel {
  // ctx: the page context; onChanged(): called after an admin action.
  constructor(ctx, onChanged, onClose) {
    this.ctx = ctx;
    this.onChanged = onChanged;
    this.onClose = onClose;
    this.name = null;
    this.jobs = new Set();
    this.el = h("aside", { testid: "host-panel", className: "host-panel" });
    this.el.hidden = true;
    this.refresher = new Refresher(() => this.load());
  }

  open(name) {
    this.name = name;
    this.jobs = new Set();
    this.el.hidden = false;
    this.el.replaceChildren(this.header(name), h("p", { className: "muted" }, "loading..."));
    this.refresher.request();
  }

  close() {
    this.name = null;
    this.el.hidden = true;
    this.el.replaceChildren();
    this.onClose();
  }

  // Re-fetch when the stream names this host or one of its jobs.
  onChange(change) {
    if (!this.name) return;
    const touched = change.all || change.nodes.has(this.name) ||
      [...this.jobs].some((id) => change.jobs.has(id));
    if (touched) this.refresher.request();
  }

  destroy() {
    this.refresher.stop();
  }

  async load() {
    const name = this.name;
    if (!name) return;
    try {
      const host = await api.get(`/v1/console/hosts/${api.seg(name)}`);
      if (name === this.name) this.render(host);
    } catch (err) {
      this.ctx.showError(err);
    }
  }

  header(name) {
    return h("div", { className: "panel-head" },
      h("h2", { testid: "host-name" }, name),
      h("button", { type: "button", className: "button ghost dark", testid: "host-close",
        title: "Close", onclick: () => this.close() }, "×"));
  }

  render(host) {
    this.jobs = new Set(host.jobs || []);
    this.el.replaceChildren(
      this.header(host.name),
      this.badges(host),
      this.facts(host),
      this.actions(host),
      h("h3", null, "Health"),
      h("ul", { testid: "host-health", className: "health" },
        itemsOr(host.health.map((s) => h("li", null, s)), "no notes")),
      h("h3", null, "GPUs"),
      this.gpuTable(host),
      h("h3", null, "Jobs"),
      h("ul", { className: "job-links" },
        itemsOr(host.job_list.map(jobLink), "no visible jobs")));
  }

  badges(host) {
    return h("div", { className: "badges" },
      h("span", { testid: "host-state", className: `badge host-state-${host.state}` }, host.state),
      host.cordoned && host.state !== "cordoned" ? h("span", { className: "badge warn" }, "cordoned") : null,
      host.degraded ? h("span", { className: "badge warn" }, "degraded") : null,
      host.reclaim_at ? h("span", { className: "badge bad", title: absTime(host.reclaim_at) },
        `reclaimed ${relTime(host.reclaim_at)}`) : null);
  }

  facts(host) {
    return h("dl", { className: "facts" },
      fact("Pool", `${host.pool} · ${host.gpu}`),
      fact("Where", `pod ${host.pod} · rack ${host.rack}`),
      fact("GPUs used", `${host.gpus_used} / ${host.gpus}`),
      fact("Heartbeat", relTime(host.last_heartbeat), absTime(host.last_heartbeat)),
      fact("Address", host.address || "-"),
      fact("Inventory", host.source));
  }

  actions(host) {
    if (this.ctx.me.role !== "admin") return null;
    return h("div", { className: "actions" }, ACTIONS.map(([verb, label]) =>
      h("button", { type: "button", className: "button small", testid: `host-${verb}`,
        onclick: () => this.act(host.name, verb) }, label)));
  }

  async act(name, verb) {
    try {
      await api.post(`/v1/nodes/${api.seg(name)}/${verb}`);
      this.refresher.request();
      this.onChanged();
    } catch (err) {
      this.ctx.showError(err);
    }
  }

  gpuTable(host) {
    const heads = ["GPU", "Job", "Team", "Rank", "Util", "Memory"].map((c) => h("th", null, c));
    return h("div", { className: "table-wrap" },
      h("table", { className: "data compact" },
        h("thead", null, h("tr", null, heads)),
        h("tbody", null, host.slots.map(gpuRow))));
  }
}
