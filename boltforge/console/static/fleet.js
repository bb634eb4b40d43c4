// The fleet page (#/fleet): summary strip, colour-by control and legend, the host map and
// the host side panel. Live: re-fetches the map (at most ~2/s) and repaints changed cells.

import * as api from "./api.js";
import { h, card } from "./dom.js";
import { assignColours, colourOf, FREE_COLOUR, num, pct } from "./format.js";
import { Refresher, nextFrame } from "./live.js";
import { FleetMap, legendCounts, HIDDEN_COLOUR } from "./fleetmap.js";
import { HostPanel } from "./hostpanel.js";
import * as topology from "./topology.js";

const POLL_MS = 10000;
const LEGEND_MAX = 14;

function stat(label, value, title) {
  return h("div", { className: "stat", title }, h("div", { className: "stat-value" }, value),
    h("div", { className: "stat-label" }, label));
}

// The summary tiles, all from the map reply.
function summaryTiles(map) {
  const share = map.gpus ? map.gpus_used / map.gpus : 0;
  return [
    stat("GPUs used", `${num(map.gpus_used)} / ${num(map.gpus)}`,
      `${pct(share, 1)} of the fleet's GPUs are held`),
    stat("Utilisation", pct(share, 1)),
    stat("Fragmentation", num(map.fragmentation, 3),
      "fragmentation index: 0 = free GPUs in whole blocks, 1 = scattered"),
    stat("Hosts ready", `${num(map.nodes_ready)} / ${num(map.nodes)}`,
      "hosts taking new work (not cordoned, dead or suspect)"),
    stat("Jobs running", num(map.jobs_running), "jobs holding GPUs"),
    stat("Jobs pending", num(map.jobs_pending), "jobs waiting in the queue"),
  ];
}

function legendItem(colour, label, count) {
  return h("span", { className: "legend-item" },
    h("span", { className: "swatch", style: { background: colour } }), label,
    h("span", { className: "muted" }, ` ${num(count)}`));
}

function legend(map, colorBy) {
  const { entries, free } = legendCounts(map, colorBy);
  const items = entries.slice(0, LEGEND_MAX).map(([key, count]) => {
    if (colorBy === "team") return legendItem(colourOf(key), key, count);
    if (!key) return legendItem(HIDDEN_COLOUR, "other teams' jobs", count);
    const [id, name] = key.split("|");
    return legendItem(colourOf(id), `${id} ${name}`, count);
  });
  if (entries.length > LEGEND_MAX) {
    items.push(h("span", { className: "muted" }, `+${entries.length - LEGEND_MAX} more`));
  }
  items.push(legendItem(FREE_COLOUR, "free", free));
  items.push(h("span", { className: "legend-item" }, h("span", { className: "swatch hatched" }),
    "cordoned / draining / dead"));
  return items;
}

export function mount(root, _arg, ctx) {
  let destroyed = false;
  let lastMap = null;
  const summary = h("div", { testid: "fleet-summary", className: "stats" });
  const legendBox = h("div", { className: "legend" });
  const colorBy = h("select", { testid: "color-by", id: "color-by" },
    h("option", { value: "team" }, "team"), h("option", { value: "job" }, "job"));
  const map = new FleetMap((name) => openHost(name));
  const panel = new HostPanel(ctx, () => refresher.request(), () => map.select(null));

  function openHost(name) {
    map.select(name);
    panel.open(name);
  }

  function draw(reply) {
    lastMap = reply;
    summary.replaceChildren(...summaryTiles(reply));
    map.render(reply);
    legendBox.replaceChildren(...legend(reply, map.colorBy));
  }

  async function load() {
    try {
      const reply = await api.get("/v1/console/map");
      topology.remember(reply);
      assignColours(reply.owners.map((o) => o.team));
      await nextFrame();
      if (!destroyed) draw(reply);
    } catch (err) {
      if (!destroyed) ctx.showError(err);
    }
  }

  const refresher = new Refresher(load).every(POLL_MS);
  colorBy.addEventListener("change", () => {
    map.setColorBy(colorBy.value, lastMap);
    if (lastMap) legendBox.replaceChildren(...legend(lastMap, map.colorBy));
  });

  root.append(
    card(null, { className: "card summary-card" }, summary),
    card("Fleet map", { className: "card map-card" },
      h("div", { className: "toolbar" },
        h("label", { for: "color-by" }, "Colour by "), colorBy, legendBox),
      map.el),
    panel.el);
  refresher.request();

  return {
    onChange(change) {
      if (change.state) refresher.request();
      panel.onChange(change);
    },
    destroy() {
      destroyed = true;
      refresher.stop();
      panel.destroy();
    },
  };
}
