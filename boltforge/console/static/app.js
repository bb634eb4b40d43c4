// The console shell: login, header (who, live status, nav), error banner, hash router and
// the live stream that drives page refreshes.

import * as api from "./api.js";
import { LiveStream } from "./stream.js";
import { assignColours } from "./format.js";
import { ChangeBatcher } from "./live.js";
import * as fleet from "./fleet.js";
import * as queue from "./queue.js";
import * as jobs from "./jobs.js";
import * as job from "./job.js";
import * as services from "./services.js";
import * as teams from "./teams.js";
import * as utilization from "./utilization.js";
import * as reports from "./reports.js";

const ROUTES = {
  fleet: fleet.mount,
  queue: queue.mount,
  jobs: jobs.mount,
  job: job.mount,
  services: services.mount,
  teams: teams.mount,
  utilization: utilization.mount,
  reports: reports.mountList,
  report: reports.mountReport,
};

const $ = (id) => document.getElementById(id);
let me = null;
let page = null;
let stream = null;
const batcher = new ChangeBatcher((change) => page && page.onChange && page.onChange(change));

// ---- error banner ----

function showError(err) {
  if (!err || err.name === "AbortError") return;
  const text = err instanceof api.ApiError ? err.detail : String(err.message || err);
  $("error-banner").textContent = text;
  $("error-box").hidden = false;
}

function clearError() {
  $("error-banner").textContent = "";
  $("error-box").hidden = true;
}

// ---- login and session ----

function showLogin() {
  stopSession();
  $("nav").hidden = true;
  $("session").hidden = true;
  $("page").replaceChildren();
  $("login").hidden = false;
  $("token-input").focus();
}

async function login(event) {
  event.preventDefault();
  const token = $("token-input").value.trim();
  if (!token) return;
  clearError();
  api.setToken(token);
  await startSession();
}

async function startSession() {
  try {
    me = await api.get("/v1/whoami");
  } catch (err) {
    api.setToken("");
    showLogin();
    showError(err);
    return;
  }
  $("token-input").value = "";
  $("login").hidden = true;
  $("nav").hidden = false;
  $("session").hidden = false;
  $("whoami").textContent = [me.name, me.role, me.team].filter(Boolean).join(" · ");
  await teamColours();
  startStream();
  route();
}

// Every known team gets its colour once, in name order, so each page colours teams alike.
async function teamColours() {
  try {
    const reply = await api.get("/v1/console/teams");
    assignColours(reply.teams.map((t) => t.team));
  } catch (_) {
    // colours then come in the order pages meet the teams
  }
}

function stopSession() {
  if (stream) stream.stop();
  stream = null;
  batcher.stop();
  unmount();
  me = null;
}

function logout() {
  api.setToken("");
  clearError();
  showLogin();
}

// A 401 anywhere: back to the login form, saying why.
function unauthorized(err) {
  api.setToken("");
  showLogin();
  if (err) showError(err);
}

// ---- live stream ----

function setLive(connected) {
  const el = $("live-status");
  el.textContent = connected ? "live" : "offline";
  el.classList.toggle("offline", !connected);
}

function startStream() {
  let wasConnected = false;
  stream = new LiveStream("/v1/console/stream", {
    onStatus: (connected) => {
      setLive(connected);
      // After a reconnect, changes may have been missed: refresh everything.
      if (connected && wasConnected) batcher.add({ all: true });
      if (connected) wasConnected = true;
    },
    onEvent: (name, data) => {
      if (name !== "change") return;
      try {
        batcher.add(JSON.parse(data));
      } catch (_) {
        batcher.add({ all: true });
      }
    },
    onUnauthorized: () => unauthorized(new api.ApiError(401, "the token is no longer valid")),
  });
  stream.start();
}

// ---- router ----

function parseHash() {
  const parts = location.hash.replace(/^#\/?/, "").split("/");
  const name = parts[0] || "fleet";
  const arg = parts.slice(1).map(decodeURIComponent).join("/");
  return ROUTES[name] ? { name, arg } : { name: "fleet", arg: "" };
}

function unmount() {
  if (page && page.destroy) page.destroy();
  page = null;
}

function route() {
  if (!me) return;
  unmount();
  clearError();
  const { name, arg } = parseHash();
  if ((name === "job" || name === "report") && !arg) {
    location.hash = name === "job" ? "#/jobs" : "#/reports";
    return;
  }
  const active = name === "job" ? "jobs" : name === "report" ? "reports" : name;
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.route === active);
  }
  const root = $("page");
  root.replaceChildren();
  root.dataset.page = name;
  page = ROUTES[name](root, arg, { me, showError, clearError });
}

function init() {
  api.setUnauthorizedHandler(unauthorized);
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  $("error-close").addEventListener("click", clearError);
  window.addEventListener("hashchange", route);
  if (api.getToken()) startSession();
  else showLogin();
}

init();
