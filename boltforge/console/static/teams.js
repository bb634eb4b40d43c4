// The teams page (#/teams): per team, GPU quota bars (guaranteed, burst, using, borrowing),
// jobs, fair-share standing, and this month's spend against its budget.

import * as api from "./api.js";
import { h, card, table, emptyRow } from "./dom.js";
import { assignColours, colourOf, dollars, num, pct } from "./format.js";
import { Refresher } from "./live.js";

const POLL_MS = 10000;
const BUDGET_COLOURS = { ok: "#3c9a5f", warn: "#d9912b", over: "#d64545" };

function mark(value, scale, className, title) {
  if (value === null || value === undefined || scale <= 0) return null;
  return h("div", { className: `bar-mark ${className}`, title,
    style: { left: `${Math.min(100, (value / scale) * 100)}%` } });
}

function segment(from, to, scale, colour, title, extra = "") {
  const left = (from / scale) * 100;
  const width = Math.max(0, ((to - from) / scale) * 100);
  return h("div", { className: `bar-seg ${extra}`, title,
    style: { left: `${left}%`, width: `${width}%`, backgroundColor: colour } });
}

// Using as a bar in the team colour (its part past the guarantee, borrowed, striped);
// guaranteed and burst as marks.
function quotaBar(t) {
  const scale = Math.max(t.burst || 0, t.guaranteed || 0, t.using, 1);
  const own = t.using - t.borrowing;
  const track = h("div", { className: "bar-track tall", testid: "quota-bar" },
    segment(0, own, scale, colourOf(t.team), `using ${t.using} GPUs`),
    segment(own, t.using, scale, colourOf(t.team), `borrowing ${t.borrowing} GPUs past its guarantee`,
      "borrowed"),
    mark(t.guaranteed, scale, "guaranteed", `guaranteed ${t.guaranteed}`),
    mark(t.burst, scale, "burst", `burst limit ${t.burst}`));
  const legend = h("div", { className: "bar-caption" },
    `using ${num(t.using)} · guaranteed ${t.guaranteed ?? "none"} · burst ${t.burst ?? "none"}` +
    ` · borrowing ${num(t.borrowing)}`,
    t.lent ? h("span", { className: "badge warn", title: "its unused guarantee is lent out now" },
      "lent") : null);
  return h("td", { className: "bar-cell" }, track, legend);
}

function spendBar(t) {
  const limit = t.budget ?? null;
  const scale = Math.max(limit || 0, t.spend, 1);
  const colour = BUDGET_COLOURS[t.budget_state] || "#6b7b8c";
  const track = h("div", { className: "bar-track tall", testid: "spend-bar" },
    segment(0, t.spend, scale, colour, `spent ${dollars(t.spend)}`),
    mark(t.soft, scale, "soft", `soft limit ${dollars(t.soft)}`),
    mark(limit, scale, "hard", `budget ${dollars(limit)}`));
  const caption = limit === null ? `${dollars(t.spend)} · no budget`
    : `${dollars(t.spend)} of ${dollars(limit)} (${pct(t.spend / limit)})` +
      (t.soft !== null && t.soft !== undefined ? ` · soft ${dollars(t.soft)}` : "");
  return h("td", { className: "bar-cell" }, track, h("div", { className: "bar-caption" }, caption,
    t.budget_state ? h("span", { className: `badge budget-${t.budget_state}` }, t.budget_state) : null));
}

function standing(t) {
  return h("td", { title: "fair-share factor 2^(-usage/share): 1 unused, 0.5 at its share" },
    h("div", { className: "standing" }, `#${t.standing}`),
    h("div", { className: "bar-caption" },
      t.factor === null
        ? `no queue of its own: one shared queue, ordered by GPUs held · usage ${num(t.usage_gpu_h, 1)} GPU-h`
        : `share ${pct(t.share, 1)} · usage ${num(t.usage_gpu_h, 1)} GPU-h · factor ${num(t.factor, 2)}`));
}

function row(t) {
  return h("tr", { testid: "team-row", dataset: { team: t.team } },
    h("td", null, h("span", { className: "swatch", style: { background: colourOf(t.team) } }), ` ${t.team}`),
    quotaBar(t),
    h("td", { className: "num nowrap" }, `${t.running} running`, h("br"), `${t.pending} pending`),
    standing(t),
    spendBar(t));
}

export function mount(root, _arg, ctx) {
  let destroyed = false;
  let signature = "";
  const t = table("teams-table", ["Team", "GPUs: using vs guaranteed | burst", "Jobs",
    "Fair share", "Spend this month vs budget"]);
  t.table.classList.add("teams");

  async function load() {
    try {
      const reply = await api.get("/v1/console/teams");
      const sig = JSON.stringify(reply);
      if (destroyed || sig === signature) return;
      signature = sig;
      assignColours(reply.teams.map((x) => x.team));
      t.tbody.replaceChildren(...reply.teams.map(row));
      if (!reply.teams.length) t.tbody.append(emptyRow(5, "No teams."));
    } catch (err) {
      if (!destroyed) ctx.showError(err);
    }
  }

  const refresher = new Refresher(load, 2000).every(POLL_MS);
  root.append(card("Teams", null,
    h("p", { className: "muted" },
      "Bars: GPUs in use in the team colour, the part borrowed past the guarantee striped; " +
      "the solid tick is the guarantee, the dashed tick the burst limit. Spend: the dashed tick is " +
      "the soft limit, the solid tick the budget."),
    t.wrap));
  refresher.request();
  return {
    onChange(change) { if (change.state) refresher.request(); },
    destroy() { destroyed = true; refresher.stop(); },
  };
}
