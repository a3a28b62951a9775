// The admin service's JSON routes, and the bearer token this tab uses for them.
//
// The token lives in sessionStorage (this tab only). It arrives in the URL fragment
// (`#token=...`, never sent to the server, removed from the address bar at once) or from the
// sign-in form.

const TOKEN_KEY = "prq.dashboard.token";
/** A request that takes longer than this is abandoned and reported as a network error. */
const REQUEST_TIMEOUT_MS = 8000;

/** The token of a `#token=...` fragment (percent-decoded; a `+` stays a `+`), or null. */
export function tokenFromFragment() {
  const field = window.location.hash
    .slice(1)
    .split("&")
    .find((part) => part.startsWith("token="));
  if (field === undefined) return null;
  // Drop the fragment so the token is not left in the address bar, history or bookmarks.
  history.replaceState(null, "", window.location.pathname + window.location.search);
  const raw = field.slice("token=".length);
  let token = raw;
  try {
    token = decodeURIComponent(raw);
  } catch {
    // Not valid percent-encoding: take it as typed.
  }
  return token.trim() || null;
}

export function loadToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function saveToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
}

export function clearToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** An HTTP answer other than 2xx; `status` 0 means the service could not be reached. */
export class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.type = type;
  }
}

async function errorFrom(response) {
  let type = `http_${response.status}`;
  let message = response.statusText || `HTTP ${response.status}`;
  try {
    const body = await response.json();
    if (body && body.error && typeof body.error === "object") {
      type = String(body.error.type ?? type);
      message = String(body.error.message ?? message);
    } else if (body && body.detail !== undefined) {
      message = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
    }
  } catch {
    // Not JSON: keep the status line.
  }
  return new ApiError(response.status, type, message);
}

/**
 * Send one request and return its JSON body.
 * `auth` false sends no token (health). `okStatuses` lists non-2xx statuses whose JSON body is
 * still an answer (health answers 503 with a body when Redis is down). `body` is sent as JSON.
 */
export async function request(
  path, { method = "GET", auth = true, okStatuses = [], body = undefined } = {},
) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (auth) {
    const token = loadToken();
    if (!token) throw new ApiError(401, "unauthorized", "not signed in");
    headers.Authorization = `Bearer ${token}`;
  }
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });
  } catch (exc) {
    const why = exc && exc.name === "TimeoutError" ? "timed out" : "cannot reach the service";
    throw new ApiError(0, "network", `${method} ${path}: ${why}`);
  }
  if (!response.ok && !okStatuses.includes(response.status)) throw await errorFrom(response);
  return response.json();
}

const q = encodeURIComponent;

export const api = {
  health: () => request("/health", { auth: false, okStatuses: [503] }),
  whoami: () => request("/api/whoami"),
  endpoints: () => request("/api/endpoints"),
  throughput: () => request("/api/throughput"),
  queued: (endpoint, limit = 50) => request(`/api/queued?endpoint=${q(endpoint)}&limit=${limit}`),
  cancel: (id) => request(`/api/requests/${q(id)}/cancel`, { method: "POST" }),
  /** `force`: forget it even while it holds work or has a live receiver (else 409). */
  forgetEndpoint: (endpoint, force = false) =>
    request(`/api/endpoint?endpoint=${q(endpoint)}${force ? "&force=true" : ""}`,
      { method: "DELETE" }),
  limits: (endpoint) => request(`/api/endpoint/limits?endpoint=${q(endpoint)}`),
  setLimits: (endpoint, limits) =>
    request(`/api/endpoint/limits?endpoint=${q(endpoint)}`, { method: "PUT", body: limits }),
  deadLetters: (endpoint, limit = 100) =>
    request(`/api/dead-letters?endpoint=${q(endpoint)}&limit=${limit}`),
  replayDeadLetter: (endpoint, id) =>
    request(`/api/dead-letters/replay?endpoint=${q(endpoint)}`, { method: "POST", body: { id } }),
  /** `ids` null: every dead letter of the endpoint. */
  purgeDeadLetters: (endpoint, ids) =>
    request(`/api/dead-letters/purge?endpoint=${q(endpoint)}`, { method: "POST", body: { ids } }),
};
