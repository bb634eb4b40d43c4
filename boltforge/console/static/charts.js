// Small SVG chart helpers: a time-series line chart with axes and legend, and a labelled
// horizontal bar.

import { h, svg } from "./dom.js";

const W = 1100;
const H = 300;
const PAD = { left: 56, right: 16, top: 14, bottom: 44 };

function clockLabel(unixS, spanS) {
  const d = new Date(unixS * 1000);
  let opts = { hour: "2-digit", minute: "2-digit" };
  if (spanS > 86400) opts = { month: "short", day: "numeric", hour: "2-digit" };
  else if (spanS < 600) opts = { hour: "2-digit", minute: "2-digit", second: "2-digit" };
  return d.toLocaleString(undefined, opts);
}

function yAxis(yMax, yFormat, yLabel, scaleY) {
  const group = svg("g", { className: "axis" });
  for (let i = 0; i <= 4; i++) {
    const value = (yMax * i) / 4;
    const y = scaleY(value);
    group.append(
      svg("line", { x1: PAD.left, x2: W - PAD.right, y1: y, y2: y, className: "grid" }),
      svg("text", { x: PAD.left - 6, y: y + 4, "text-anchor": "end" }, yFormat(value)),
    );
  }
  const midY = PAD.top + (H - PAD.top - PAD.bottom) / 2;
  group.append(svg("text", {
    x: 14, y: midY, "text-anchor": "middle", transform: `rotate(-90 14 ${midY})`,
    className: "axis-label",
  }, yLabel));
  return group;
}

function xAxis(x0, x1, xLabel, scaleX) {
  const group = svg("g", { className: "axis" });
  const base = H - PAD.bottom;
  group.append(svg("line", { x1: PAD.left, x2: W - PAD.right, y1: base, y2: base }));
  for (let i = 0; i <= 4; i++) {
    const t = x0 + ((x1 - x0) * i) / 4;
    const x = scaleX(t);
    const anchor = i === 0 ? "start" : i === 4 ? "end" : "middle";
    group.append(svg("text", { x, y: base + 16, "text-anchor": anchor }, clockLabel(t, x1 - x0)));
  }
  group.append(svg("text", {
    x: PAD.left + (W - PAD.left - PAD.right) / 2, y: H - 6, "text-anchor": "middle",
    className: "axis-label",
  }, xLabel));
  return group;
}

function legendKey(s) {
  return svg("svg", { width: 22, height: 10, className: "legend-line" },
    svg("line", { x1: 0, x2: 22, y1: 5, y2: 5, stroke: s.colour, "stroke-width": s.width || 2,
      "stroke-dasharray": s.dash }));
}

function legend(series) {
  return h("div", { className: "legend" }, series.map((s) => h("span", { className: "legend-item" },
    legendKey(s), s.label)));
}

// The area under one series, lightly filled.
function area(xs, s, scaleX, scaleY) {
  const base = scaleY(0).toFixed(1);
  const top = xs.map((t, i) => `L${scaleX(t).toFixed(1)},${scaleY(s.values[i]).toFixed(1)}`);
  const d = `M${scaleX(xs[0]).toFixed(1)},${base} ${top.join(" ")} ` +
    `L${scaleX(xs[xs.length - 1]).toFixed(1)},${base} Z`;
  return svg("path", { d, fill: s.colour, "fill-opacity": 0.12, stroke: "none", className: "area" });
}

// A line chart. opts: {testid, xs: [unix s], series: [{label, colour, values, dash, width}],
// yMax, yFormat(v), yLabel, xLabel, x0, x1 (the time range; default: the samples'), area
// (fill under the first series)}.
// Returns a div with the SVG and its legend.
export function lineChart(opts) {
  const { xs, series, yMax } = opts;
  const x0 = opts.x0 ?? (xs.length ? xs[0] : 0);
  const x1 = Math.max(opts.x1 ?? (xs.length ? xs[xs.length - 1] : 0), x0 + 1);
  const scaleX = (t) => PAD.left + ((t - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
  const scaleY = (v) => H - PAD.bottom - (Math.min(v, yMax) / yMax) * (H - PAD.top - PAD.bottom);
  const chart = svg("svg", {
    testid: opts.testid, viewBox: `0 0 ${W} ${H}`, className: "chart",
    role: "img", "aria-label": opts.title || opts.yLabel,
  });
  chart.append(yAxis(yMax, opts.yFormat, opts.yLabel, scaleY), xAxis(x0, x1, opts.xLabel, scaleX));
  if (opts.area && xs.length > 1) chart.append(area(xs, series[0], scaleX, scaleY));
  for (const s of series) {
    const points = xs.map((t, i) => `${scaleX(t).toFixed(1)},${scaleY(s.values[i]).toFixed(1)}`);
    chart.append(svg("polyline", {
      points: points.join(" "), fill: "none", stroke: s.colour, "stroke-width": s.width || 2,
      "stroke-dasharray": s.dash, "stroke-linejoin": "round",
      className: "series", dataset: { series: s.label },
    }, svg("title", null, s.label)));
  }
  if (!xs.length) {
    chart.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", className: "muted" },
      "no samples yet"));
  }
  return h("div", { className: "chart-box" }, chart, legend(series));
}

// One horizontal bar: label, a track with a fill (value/max), and a value text.
// opts: {label, value, max, colour, text, title, mark (a value drawn as a tick)}.
export function hBar(opts) {
  const width = opts.max > 0 ? Math.min(100, (opts.value / opts.max) * 100) : 0;
  const track = h("div", { className: "bar-track", title: opts.title },
    h("div", { className: "bar-fill", style: { width: `${width}%`, background: opts.colour } }));
  if (opts.mark !== undefined && opts.mark !== null && opts.max > 0) {
    const left = Math.min(100, (opts.mark / opts.max) * 100);
    track.append(h("div", { className: "bar-mark", style: { left: `${left}%` } }));
  }
  return [h("span", { className: "bar-label" }, opts.label), track,
    h("span", { className: "bar-value" }, opts.text)];
}
