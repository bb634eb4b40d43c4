// The fleet map: pods and racks as labelled groups, one block per host with a cell per GPU.
// Built once per topology; each later render only touches the cells and hosts that changed.

import { h } from "./dom.js";
import { colourOf, FREE_COLOUR, relTime } from "./format.js";

export const HIDDEN_COLOUR = "#8b95a1";
const DOWN_STATES = new Set(["dead", "cordoned", "draining", "suspect"]);

// A string that changes when hosts come, go or move.
function layoutSignature(map) {
  const parts = [];
  for (const pod of map.pods) {
    parts.push("P", pod.name);
    for (const rack of pod.racks) {
      parts.push("R", rack.name);
      for (const host of rack.hosts) parts.push(host.name, host.gpus.length);
    }
  }
  return parts.join(" ");
}

function countHosts(map) {
  let n = 0;
  for (const pod of map.pods) for (const rack of pod.racks) n += rack.hosts.length;
  return n;
}

function sizeClass(hosts) {
  if (hosts <= 64) return "size-l";
  if (hosts <= 512) return "size-m";
  return "size-s";
}

export class FleetMap {
  constructor(onHostClick) {
    this.el = h("div", { testid: "fleet-map", className: "fleet-map" });
    this.hosts = new Map();
    this.layout = null;
    this.renders = 0;
    this.colorBy = "team";
    this.selected = null;
    this.el.addEventListener("click", (event) => {
      const host = event.target.closest("[data-testid=host]");
      if (host) onHostClick(host.dataset.host);
    });
  }

  // Apply one map reply: rebuild if the topology changed, else update what changed.
  render(map) {
    const start = performance.now();
    const signature = layoutSignature(map);
    if (signature !== this.layout) this.build(map, signature);
    this.update(map);
    this.renders += 1;
    this.el.dataset.rendered = String(this.renders);
    this.el.dataset.renderMs = (performance.now() - start).toFixed(1);
  }

  setColorBy(mode, map) {
    this.colorBy = mode;
    if (map) this.render(map);
  }

  select(name) {
    const old = this.hosts.get(this.selected);
    if (old) old.el.classList.remove("selected");
    this.selected = name;
    const now = this.hosts.get(name);
    if (now) now.el.classList.add("selected");
  }

  build(map, signature) {
    this.layout = signature;
    this.hosts.clear();
    this.el.className = `fleet-map ${sizeClass(countHosts(map))}`;
    const cellProto = h("span", { testid: "gpu", className: "gpu" });
    const pods = map.pods.map((pod) => this.buildPod(pod, cellProto));
    this.el.replaceChildren(...pods);
    this.select(this.selected);
  }

  buildPod(pod, cellProto) {
    const gpus = pod.racks.reduce((n, r) => n + r.hosts.reduce((m, x) => m + x.gpus.length, 0), 0);
    const racks = pod.racks.map((rack) => this.buildRack(rack, cellProto));
    return h("section", { className: "pod", testid: "pod", dataset: { pod: pod.name } },
      h("div", { className: "pod-label" }, `pod ${pod.name}`,
        h("span", { className: "muted" }, ` · ${pod.racks.length} racks · ${gpus} GPUs`)),
      h("div", { className: "racks" }, racks));
  }

  buildRack(rack, cellProto) {
    const hosts = rack.hosts.map((host) => this.buildHost(host, cellProto));
    return h("div", { className: "rack", testid: "rack", dataset: { rack: rack.name } },
      h("div", { className: "rack-label", title: `rack ${rack.name}` }, rack.name),
      h("div", { className: "hosts" }, hosts));
  }

  buildHost(host, cellProto) {
    const el = h("div", { testid: "host", className: "host", dataset: { host: host.name } });
    const cells = host.gpus.map(() => el.appendChild(cellProto.cloneNode(false)));
    if (this.el.classList.contains("size-l")) {
      el.append(h("span", { className: "host-label" }, host.name));
    }
    this.hosts.set(host.name, { el, cells, keys: cells.map(() => null), facts: null });
    return el;
  }

  update(map) {
    for (const pod of map.pods) {
      for (const rack of pod.racks) {
        for (const host of rack.hosts) this.updateHost(host, map.owners);
      }
    }
  }

  updateHost(host, owners) {
    const entry = this.hosts.get(host.name);
    let used = 0;
    for (let i = 0; i < host.gpus.length; i++) {
      const owner = host.gpus[i] >= 0 ? owners[host.gpus[i]] : null;
      if (owner) used += 1;
      const key = owner ? `${this.colorBy}|${owner.job || ""}|${owner.team}|${owner.state}` : "";
      if (key !== entry.keys[i]) {
        entry.keys[i] = key;
        this.paintCell(entry.cells[i], host.name, i, owner);
      }
    }
    const facts = `${host.state}|${host.degraded}|${host.reclaim_at}|${used}`;
    if (facts !== entry.facts) {
      entry.facts = facts;
      this.paintHost(entry.el, host, used);
    }
  }

  paintCell(cell, hostName, index, owner) {
    if (!owner) {
      cell.dataset.owner = "";
      cell.dataset.team = "";
      cell.style.background = FREE_COLOUR;
      cell.title = `${hostName} GPU ${index}: free`;
      return;
    }
    cell.dataset.owner = owner.job || "";
    cell.dataset.team = owner.team || "";
    cell.style.background = this.colourFor(owner);
    const what = owner.job ? `job ${owner.job} ${owner.name || ""} (${owner.state || "?"})`
      : "a job of another team";
    cell.title = `${hostName} GPU ${index}: ${what}, team ${owner.team}`;
  }

  colourFor(owner) {
    if (this.colorBy === "job") return owner.job ? colourOf(owner.job) : HIDDEN_COLOUR;
    return colourOf(owner.team || "?");
  }

  paintHost(el, host, used) {
    el.dataset.state = host.state;
    el.classList.toggle("down", DOWN_STATES.has(host.state));
    el.classList.toggle("dead", host.state === "dead");
    el.classList.toggle("degraded", Boolean(host.degraded));
    const notes = [host.state];
    if (host.degraded) notes.push("degraded");
    if (host.reclaim_at) notes.push(`reclaimed ${relTime(host.reclaim_at)}`);
    el.title = `${host.name}: ${notes.join(", ")} · ${host.pool} ${host.gpu} · ` +
      `${used}/${host.gpus.length} GPUs used`;
  }
}

// GPU counts per legend key (team, or job in job mode) over a map reply, largest first.
export function legendCounts(map, colorBy) {
  const perOwner = new Array(map.owners.length).fill(0);
  let free = 0;
  for (const pod of map.pods) {
    for (const rack of pod.racks) {
      for (const host of rack.hosts) {
        for (const g of host.gpus) {
          if (g >= 0) perOwner[g] += 1;
          else free += 1;
        }
      }
    }
  }
  const counts = new Map();
  map.owners.forEach((owner, i) => {
    const key = colorBy === "job" ? (owner.job ? `${owner.job}|${owner.name || ""}` : "") : owner.team;
    counts.set(key, (counts.get(key) || 0) + perOwner[i]);
  });
  const entries = [...counts.entries()].filter(([, n]) => n > 0).sort((a, b) => b[1] - a[1]);
  return { entries, free };
}
