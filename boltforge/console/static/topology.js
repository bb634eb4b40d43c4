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

// Remember a fresh map reply of the whole fleet (the fleet page hands over the ones it fetches).
export function remember(map) {
  cached = indexHosts(map);
  fetchedAt = Date.now();
}

// Where the wanted hosts sit: from the cache while it is under a minute old and knows them
// all, else from a map of just those hosts (a job page need not download the whole fleet).
export async function hostIndex(wanted = []) {
  if (!wanted.length) return cached || new Map();
  const fresh = cached && Date.now() - fetchedAt <= MAX_AGE_MS;
  if (fresh && wanted.every((name) => cached.has(name))) return cached;
  const query = new URLSearchParams({ hosts: wanted.join(",") });
  return indexHosts(await api.get(`/v1/console/map?${query}`));
}
