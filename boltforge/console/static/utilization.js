// The utilization page (#/utilization): allocated, compute and productive GPUs as % of the
// fleet, and the fragmentation index, over a chosen window.

import * as api from "./api.js";
import { h, card } from "./dom.js";
import { lineChart } from "./charts.js";
import { num, pct } from "./format.js";
import { Refresher } from "./live.js";
import { select } from "./jobcells.js";

const WINDOWS = [["900", "15m"], ["3600", "1h"], ["21600", "6h"], ["86400", "24h"]];
const POLL_MS = 5000;
// Key, label, colour, dash and width: the lines often coincide, so each has its own stroke.
const SERIES = [
  ["allocated", "Allocated", "#3b82c4", null, 4],
  ["compute", "Compute", "#8a5cc2", "8 4", 2.5],
  ["productive", "Productive", "#3c9a5f", "2 3", 2.5],
];

function share(sample, key) {
  return sample.gpus > 0 ? (sample[key] / sample.gpus) * 100 : 0;
}

// The chart's time range: the window up to now, or from the first sample when the server's
// history is shorter than the window (it keeps samples since it started).
function range(windowS, samples) {
  const x1 = Date.now() / 1000;
  const first = samples.length ? samples[0].at : x1;
  const x0 = Math.max(x1 - Number(windowS), Math.min(first, x1 - 60));
  return { x0, x1 };
}

function timeLabel(windowS, samples, windowLabel) {
  const { x0, x1 } = range(windowS, samples);
  return x1 - x0 < Number(windowS) - 1 ? "time (since the server started)" : `time (last ${windowLabel})`;
}

function utilChart(samples, windowS, windowLabel) {
  return lineChart({
    testid: "util-chart", title: "GPU utilisation", ...range(windowS, samples), area: true,
    xs: samples.map((s) => s.at),
    series: SERIES.map(([key, label, colour, dash, width]) => ({
      label, colour, dash, width, values: samples.map((s) => share(s, key)),
    })),
    yMax: 100, yFormat: (v) => `${Math.round(v)}%`, yLabel: "% of GPUs",
    xLabel: timeLabel(windowS, samples, windowLabel),
  });
}

function fragChart(samples, windowS, windowLabel) {
  return lineChart({
    testid: "frag-chart", title: "Fragmentation index", ...range(windowS, samples), area: true,
    xs: samples.map((s) => s.at),
    series: [{
      label: "Fragmentation index", colour: "#d9912b", values: samples.map((s) => s.fragmentation),
    }],
    yMax: 1, yFormat: (v) => v.toFixed(2), yLabel: "index (0-1)",
    xLabel: timeLabel(windowS, samples, windowLabel),
  });
}

function latest(samples) {
  const s = samples[samples.length - 1];
  if (!s) return "No samples yet.";
  return `Now: ${num(s.allocated)} of ${num(s.gpus)} GPUs allocated (${pct(s.allocated / (s.gpus || 1))}), ` +
    `${num(s.compute)} computing, ${num(s.productive)} productive; fragmentation ${num(s.fragmentation, 3)}.`;
}

export function mount(root, _arg, ctx) {
  let destroyed = false;
  let windowS = "3600";
  const label = () => WINDOWS.find(([v]) => v === windowS)[1];
  const win = select("util-window", "Window", WINDOWS, (v) => { windowS = v; refresher.request(); });
  win.el.value = windowS;
  const now = h("p", { className: "muted" });
  const util = h("div");
  const frag = h("div");

  async function load() {
    try {
      const reply = await api.get(`/v1/console/utilization?window_s=${windowS}`);
      if (destroyed) return;
      now.textContent = `${latest(reply.samples)} Sampled every ${num(reply.step_s)} s.`;
      util.replaceChildren(utilChart(reply.samples, windowS, label()));
      frag.replaceChildren(fragChart(reply.samples, windowS, label()));
    } catch (err) {
      if (!destroyed) ctx.showError(err);
    }
  }

  const refresher = new Refresher(load, 1000).every(POLL_MS);
  root.append(
    card("GPU utilisation", null, h("div", { className: "toolbar" }, win.box), now, util),
    card("Fragmentation", null, frag));
  refresher.request();
  return {
    onChange() {},
    destroy() { destroyed = true; refresher.stop(); },
  };
}
