// A job's log view: the last 200 lines, following new ones with ?after=N.

import * as api from "./api.js";
import { h } from "./dom.js";

const KEEP = 200;
const MAX_PAGES = 50;

export class LogView {
  constructor(jobId, ctx) {
    this.jobId = jobId;
    this.ctx = ctx;
    this.next = 0;
    this.lines = [];
    this.pre = h("pre", { className: "logs" }, "loading...");
    this.el = h("div", { testid: "job-logs" }, this.pre);
  }

  // Fetch every page of new lines, keep the last KEEP, repaint if any came.
  async load() {
    let fresh = 0;
    for (let i = 0; i < MAX_PAGES; i++) {
      const page = await api.get(`/v1/jobs/${api.seg(this.jobId)}/logs?after=${this.next}`);
      const got = page.lines.length;
      this.next = page.next;
      fresh += got;
      this.lines.push(...page.lines.flatMap((l) => l.replace(/\n$/, "").split("\n")));
      if (this.lines.length > KEEP) this.lines = this.lines.slice(-KEEP);
      if (!got) break;
    }
    if (fresh || this.pre.textContent === "loading...") this.paint();
  }

  paint() {
    const pre = this.pre;
    const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
    pre.textContent = this.lines.length ? this.lines.join("\n") : "(no output yet)";
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }
}
