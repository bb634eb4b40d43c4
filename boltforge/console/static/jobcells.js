// Table cells and filters shared by the queue and jobs pages.

import { h } from "./dom.js";
import { absTime, relTime, stateClass } from "./format.js";

export const PRIORITIES = ["production", "high", "normal", "low"];

export function jobCell(job) {
  return h("td", { className: "job-cell" },
    h("a", { href: `#/job/${encodeURIComponent(job.id)}`, className: "job-id" }, job.id),
    h("span", { className: "job-name" }, job.name));
}

export function stateCell(state) {
  return h("td", null, h("span", { className: stateClass(state) }, state));
}

export function priorityCell(job) {
  return h("td", null, h("span", { className: `badge prio-${job.priority_name}` }, job.priority_name));
}

export function timeCell(unixS, fallback = "unknown") {
  if (unixS === null || unixS === undefined) return h("td", { className: "muted" }, fallback);
  return h("td", { title: absTime(unixS) }, relTime(unixS));
}

// A table row that opens the job on click or Enter.
export function jobRow(testid, job, cells) {
  const open = () => { location.hash = `#/job/${encodeURIComponent(job.id)}`; };
  return h("tr", {
    testid, className: "clickable", tabindex: 0,
    dataset: { job: job.id, state: job.state },
    onclick: (event) => { if (!event.target.closest("a")) open(); },
    onkeydown: (event) => { if (event.key === "Enter") open(); },
  }, cells);
}

// A labelled <select>; options: [[value, label]].
export function select(testid, label, options, onChange) {
  const el = h("select", { testid, id: testid, onchange: () => onChange(el.value) },
    options.map(([value, text]) => h("option", { value }, text)));
  return { el, box: h("label", { className: "filter", for: testid }, label, el) };
}

// Keep a <select>'s options in step with a growing set of values (the first option is "all").
export function syncOptions(el, values) {
  const have = new Set([...el.options].map((o) => o.value));
  for (const value of [...values].sort()) {
    if (!have.has(value)) el.append(h("option", { value }, value));
  }
}
