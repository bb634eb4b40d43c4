// Formatting: relative and absolute times, durations, numbers, dollars and stable colours.

// "3m ago" / "in 5m" from unix seconds; "unknown" for null.
export function relTime(unixS, nowMs = Date.now()) {
  if (unixS === null || unixS === undefined) return "unknown";
  const delta = unixS - nowMs / 1000;
  if (Math.abs(delta) < 5) return "now";
  const span = duration(Math.abs(delta));
  return delta < 0 ? `${span} ago` : `in ${span}`;
}

// Local absolute time for a title attribute.
export function absTime(unixS) {
  if (unixS === null || unixS === undefined) return "";
  return new Date(unixS * 1000).toLocaleString();
}

// A <time>-like span: relative text, absolute time on hover.
export function timeText(unixS) {
  return { text: relTime(unixS), title: absTime(unixS) };
}

// 45s, 3m, 2h 5m, 3d 4h.
export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) {
    const m = Math.floor((s % 3600) / 60);
    return m ? `${Math.floor(s / 3600)}h ${m}m` : `${Math.floor(s / 3600)}h`;
  }
  const hrs = Math.floor((s % 86400) / 3600);
  return hrs ? `${Math.floor(s / 86400)}d ${hrs}h` : `${Math.floor(s / 86400)}d`;
}

export function dollars(value) {
  if (value === null || value === undefined) return "-";
  const digits = Math.abs(value) >= 100 ? 0 : 2;
  return "$" + value.toLocaleString(undefined, {
    minimumFractionDigits: digits, maximumFractionDigits: digits,
  });
}

export function num(value, digits = 0) {
  if (value === null || value === undefined) return "-";
  return value.toLocaleString(undefined, {
    minimumFractionDigits: digits, maximumFractionDigits: digits,
  });
}

// A job's GPUs, as `bolt` prints them (boltforge/wire/gpuamount.py): "8 GPU(s)", or for a
// job on parts of one GPU (gpu_part) "0.25 GPU", "4 x 0.25 GPU", "MIG 1g.10gb"; without the
// unit, for a table column: "8", "0.25", "4x0.25", "1g.10gb".
export function gpuAmount(job, unit = true) {
  const part = job.gpu_part || "";
  if (job.gpus || !part) return unit ? `${job.gpus} GPU(s)` : String(job.gpus);
  const mig = part.includes("g");
  const each = unit ? (mig ? `MIG ${part}` : `${part} GPU`) : part;
  if (job.replicas <= 1) return each;
  return unit ? `${job.replicas} x ${each}` : `${job.replicas}x${each}`;
}

// A 0-based queue position shown 1-based; "-" when none.
export function position(pos) {
  return pos === null || pos === undefined ? "-" : String(pos + 1);
}

export function pct(fraction, digits = 0) {
  if (fraction === null || fraction === undefined) return "-";
  return `${(fraction * 100).toFixed(digits)}%`;
}

export function seconds(value) {
  if (value === null || value === undefined) return "-";
  return value < 1 ? `${Math.round(value * 1000)} ms` : `${value.toFixed(2)} s`;
}

// A stable 32-bit hash of a string (FNV-1a).
function hash(text) {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

const colourCache = new Map();

// Distinct colours for teams: a fleet has few, and hashed hues often land close together.
const PALETTE = [
  "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1",
  "#edc948", "#ff9da7", "#9c755f", "#17becf", "#bcbd22", "#1f3b73",
];
const assigned = new Map();

// Give each new name (a team) the next unused palette colour, in sorted order within one call;
// a name keeps its colour once given, so colours on screen never shift.
export function assignColours(names) {
  for (const name of [...new Set(names)].sort()) {
    if (!assigned.has(name) && assigned.size < PALETTE.length) {
      assigned.set(name, PALETTE[assigned.size]);
    }
  }
}

// A stable colour for a team (from the palette once assigned) or a job (a hashed HSL).
export function colourOf(name) {
  let colour = assigned.get(name) || colourCache.get(name);
  if (!colour) {
    const h = hash(name);
    const hue = h % 360;
    const sat = 55 + ((h >>> 9) % 20);
    const light = 45 + ((h >>> 17) % 15);
    colour = `hsl(${hue}, ${sat}%, ${light}%)`;
    colourCache.set(name, colour);
  }
  return colour;
}

export const FREE_COLOUR = "#dfe3e8";

// A CSS class for a job state badge.
export function stateClass(state) {
  return `badge state-${state || "unknown"}`;
}
