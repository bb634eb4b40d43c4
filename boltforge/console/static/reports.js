// The reports pages: #/reports lists simulation reports; #/report/NAME shows one report's
// title, command, comparison table and its plots (fetched with the token, shown as blobs).

import * as api from "./api.js";
import { h, card, table, empty, emptyRow } from "./dom.js";
import { absTime, relTime } from "./format.js";

function reportRow(r) {
  return h("tr", { dataset: { report: r.name } },
    h("td", null, h("a", { testid: "report-link", href: `#/report/${encodeURIComponent(r.name)}` },
      r.title || r.name)),
    h("td", null, r.name),
    h("td", null, r.policies.join(", ") || "-"),
    h("td", { title: absTime(r.created_at) }, relTime(r.created_at)));
}

export function mountList(root, _arg, ctx) {
  let destroyed = false;
  const t = table("reports-table", ["Report", "Name", "Policies", "Created"]);
  root.append(card("Simulation reports", null,
    h("p", { className: "muted" },
      "Written by bolt simulate --report DIR under the server's --reports folder."),
    t.wrap));
  api.get("/v1/console/reports").then((reply) => {
    if (destroyed) return;
    const rows = reply.reports.slice().sort((a, b) => b.created_at - a.created_at);
    t.tbody.replaceChildren(...rows.map(reportRow));
    if (!rows.length) t.tbody.append(emptyRow(4, "No reports yet."));
  }).catch((err) => { if (!destroyed) ctx.showError(err); });
  return { onChange() {}, destroy() { destroyed = true; } };
}

function comparison(report) {
  const t = table("report-table", report.columns.map(([, label]) => label));
  t.tbody.append(...report.rows.map((row) => h("tr", null,
    report.columns.map(([key], i) => h("td", { className: i ? "num" : "" }, row[key] ?? "")))));
  return t.wrap;
}

export function mountReport(root, name, ctx) {
  let destroyed = false;
  const urls = [];

  async function plot(file) {
    const img = h("img", { testid: "report-plot", alt: file, title: file, className: "plot" });
    const figure = h("figure", null, img, h("figcaption", null, file));
    try {
      const url = await api.blobUrl(`/v1/console/reports/${api.seg(name)}/files/${api.seg(file)}`);
      if (destroyed) { URL.revokeObjectURL(url); return figure; }
      urls.push(url);
      img.src = url;
      // Hand the figure over only once the image is decoded, so a drawn plot is a loaded one.
      await img.decode().catch(() => {});
    } catch (err) {
      ctx.showError(err);
    }
    return figure;
  }

  function draw(report) {
    const plots = h("div", { className: "plots" });
    root.append(
      card(null, null,
        h("p", null, h("a", { href: "#/reports" }, "← all reports")),
        h("h1", { testid: "report-title" }, report.title || report.name),
        h("pre", { className: "command", testid: "report-command" }, report.command)),
      card("Comparison", null, comparison(report)),
      card("Plots", null, report.files.length ? plots : empty("No plots in this report.")));
    for (const file of report.files) plots.append(h("div", { className: "plot-slot", dataset: { file } }));
    report.files.forEach(async (file, i) => {
      const fig = await plot(file);
      if (!destroyed) plots.children[i].replaceChildren(fig);
    });
  }

  api.get(`/v1/console/reports/${api.seg(name)}`)
    .then((report) => { if (!destroyed) draw(report); })
    .catch((err) => { if (!destroyed) ctx.showError(err); });

  return {
    onChange() {},
    destroy() {
      destroyed = true;
      for (const url of urls) URL.revokeObjectURL(url);
    },
  };
}
