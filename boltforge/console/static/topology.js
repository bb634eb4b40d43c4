// A cached view of where each host sits (pod, rack, GPU count), from GET /v1/console/map.

import * as api from "./api.js";

const MAX_AGE_MS = 60000;
let cached = null;
let fetchedAt = 0;

// Host name -> {pod, rack, gpus, state}, from a map reply.
export function indexHosts(map) {
  const hosts = new Map();
  for (const pod of map.pods) {
    for (const rack of pod.racks) {
      for (const host of rack.hosts) {
        hosts.set(host.name, {
          pod: pod.name, rack: rack.name, gpus: host.gpus.length, state: host.state,
        });
      }
    }
  }
  return hosts;
}

// Remember a fresh map reply (the fleet page hands over the ones it fetches).
export function remember(map) {
  cached = indexHosts(map);
  fetchedAt = Date.now();
}

// The host index; re-fetched when older than a minute or when a wanted host is missing.
export async function hostIndex(wanted = []) {
  const stale = !cached || Date.now() - fetchedAt > MAX_AGE_MS;
  const missing = cached && wanted.some((name) => !cached.has(name));
  if (stale || missing) remember(await api.get("/v1/console/map"));
  return cached;
}
