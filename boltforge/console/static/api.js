// API access: the stored bearer token, JSON GET/POST, blob downloads and API errors.

const TOKEN_KEY = "bolt.token";
let onUnauthorized = () => {};

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
    this.detail = detail;
  }
}

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

// Called with the ApiError whenever the server answers 401.
export function setUnauthorizedHandler(handler) {
  onUnauthorized = handler;
}

export function authHeaders() {
  return { Authorization: `Bearer ${getToken()}` };
}

// The error text of a failed reply: "detail" (or the API's "error"), else the status line.
async function errorOf(response) {
  let text = `${response.status} ${response.statusText}`.trim();
  try {
    const body = await response.json();
    const detail = body.detail ?? body.error;
    if (typeof detail === "string") text = detail;
    else if (detail) text = JSON.stringify(detail);
  } catch (_) {
    // not JSON: keep the status line
  }
  return new ApiError(response.status, text);
}

async function request(method, path, options = {}) {
  let response;
  try {
    response = await fetch(path, {
      method, headers: authHeaders(), signal: options.signal,
    });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, `cannot reach the server: ${err.message}`);
  }
  if (!response.ok) {
    const error = await errorOf(response);
    if (response.status === 401) onUnauthorized(error);
    throw error;
  }
  return response;
}

export async function get(path, options) {
  return (await request("GET", path, options)).json();
}

export async function post(path, options) {
  return (await request("POST", path, options)).json();
}

// A binary file as an object URL (the caller revokes it).
export async function blobUrl(path, options) {
  const blob = await (await request("GET", path, options)).blob();
  return URL.createObjectURL(blob);
}

// Encode one path segment.
export function seg(value) {
  return encodeURIComponent(value);
}
