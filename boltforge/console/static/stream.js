// The live stream: GET /v1/console/stream read with fetch + a stream reader (EventSource cannot
// send the token), parsed into events, reconnecting 1 s after it drops.

import { authHeaders } from "./api.js";

const RECONNECT_MS = 1000;

// Parse one event block ("event: x\ndata: {...}") into {event, data}; null for comments only.
function parseBlock(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith(":") || line === "") continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  return data.length ? { event, data: data.join("\n") } : null;
}

// Opens the stream and keeps it open until stop(). handlers: {onEvent(name, data),
// onStatus(connected), onUnauthorized(status)}.
export class LiveStream {
  constructor(url, handlers) {
    this.url = url;
    this.handlers = handlers;
    this.controller = null;
    this.timer = null;
    this.stopped = false;
  }

  start() {
    this.stopped = false;
    this.connect();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.controller) this.controller.abort();
    this.handlers.onStatus(false);
  }

  async connect() {
    this.controller = new AbortController();
    try {
      const response = await fetch(this.url, {
        headers: authHeaders(), signal: this.controller.signal, cache: "no-store",
      });
      if (response.status === 401) {
        this.handlers.onUnauthorized(response.status);
        return;
      }
      if (!response.ok || !response.body) throw new Error(`stream ${response.status}`);
      this.handlers.onStatus(true);
      await this.read(response.body.getReader());
    } catch (_) {
      // dropped: reconnect below
    }
    this.handlers.onStatus(false);
    if (!this.stopped) this.timer = setTimeout(() => this.connect(), RECONNECT_MS);
  }

  async read(reader) {
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      // Normalise line ends; a lone trailing \r may be the first half of \r\n.
      buffer = buffer.replace(/\r\n/g, "\n").replace(/\r(?!$)/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const parsed = parseBlock(buffer.slice(0, cut));
        buffer = buffer.slice(cut + 2);
        if (parsed) this.handlers.onEvent(parsed.event, parsed.data);
      }
    }
  }
}
