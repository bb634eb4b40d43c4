// Live-update plumbing: merge stream "change" events into at most ~2 flushes a second, and
// run a page's refresh with one fetch in flight at a time.

const FLUSH_MS = 500;

// Collects change events ({jobs, logs, nodes, all}) and hands the merged set to flush() at
// most once per FLUSH_MS. The merged set's "state" is true when some event was more than new
// log output (a job, node or another team's work changed): pages showing the fleet or lists
// refresh on it, while log-only events just move a job page's log.
export class ChangeBatcher {
  constructor(flush) {
    this.flush = flush;
    this.reset();
    this.timer = null;
    this.lastFlush = 0;
  }

  reset() {
    this.jobs = new Set();
    this.logs = new Set();
    this.nodes = new Set();
    this.all = false;
    this.state = false;
  }

  add(change) {
    for (const id of change.jobs || []) this.jobs.add(String(id));
    for (const id of change.logs || []) this.logs.add(String(id));
    for (const name of change.nodes || []) this.nodes.add(String(name));
    if (change.all) this.all = true;
    const logOnly = (change.logs || []).length && !(change.jobs || []).length &&
      !(change.nodes || []).length && !change.all;
    if (!logOnly) this.state = true;
    this.schedule();
  }

  schedule() {
    if (this.timer) return;
    const wait = Math.max(0, this.lastFlush + FLUSH_MS - Date.now());
    this.timer = setTimeout(() => this.fire(), wait);
  }

  fire() {
    this.timer = null;
    this.lastFlush = Date.now();
    const merged = {
      jobs: this.jobs, logs: this.logs, nodes: this.nodes, all: this.all, state: this.state,
    };
    this.reset();
    this.flush(merged);
  }

  stop() {
    clearTimeout(this.timer);
    this.timer = null;
    this.reset();
  }
}

// Wraps an async refresh so that calls during a run queue one more run (never two at once),
// runs are at least minGapMs apart, and nothing runs after stop().
export class Refresher {
  constructor(run, minGapMs = FLUSH_MS) {
    this.run = run;
    this.minGapMs = minGapMs;
    this.running = false;
    this.again = false;
    this.stopped = false;
    this.last = 0;
    this.timer = null;
  }

  request() {
    if (this.stopped) return;
    if (this.running || this.timer) {
      this.again = this.running || this.again;
      return;
    }
    const wait = Math.max(0, this.last + this.minGapMs - Date.now());
    if (wait > 0) this.timer = setTimeout(() => this.go(), wait);
    else this.go();
  }

  async go() {
    this.timer = null;
    if (this.stopped) return;
    this.running = true;
    this.last = Date.now();
    try {
      await this.run();
    } finally {
      this.running = false;
      if (this.again && !this.stopped) {
        this.again = false;
        this.request();
      }
    }
  }

  // Also refresh every intervalMs (a fallback when the stream is quiet or down).
  every(intervalMs) {
    this.interval = setInterval(() => this.request(), intervalMs);
    return this;
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    clearInterval(this.interval);
  }
}

// Resolve on the next animation frame (DOM work goes there).
export function nextFrame() {
  return new Promise((resolve) => requestAnimationFrame(() => resolve()));
}
