// The prq dashboard: health banner, endpoints table, throughput chart, one endpoint's queued
// requests (with Cancel for admins), its capacity limits (with a form to set them, for admins),
// its waiting requests per priority, and its dead letters (with Replay and Purge all, for
// admins); an admin may forget the endpoint (after a confirmation, and a second one to force it
// while it holds work). Everything refreshes every REFRESH_MS.
//
// States: signed out (the form shows) → signed in (role known from /api/whoami; data refreshes).
// A 401 on any call signs out. Other errors show in the status line and the next refresh retries.

import { api, clearToken, loadToken, saveToken, tokenFromFragment } from "./api.js";
import { renderThroughput } from "./chart.js";
import { el, formatAge, formatBytes, formatClock, formatCount, formatDateTime } from "./dom.js";
import { renderPriorities, resetPriorities } from "./priorities.js";

const REFRESH_MS = 2000;
/** Most dead letters the panel lists (newest first). */
const DEAD_LETTERS_SHOWN = 100;
/** Characters of a dead letter's preview shown in its row (all of it in the tooltip). */
const PREVIEW_CHARS = 80;
/** Shown for a body the service did not read: too large for a listing (its size still shows). */
const NOT_READ = "(body too large to read here)";

const $ = (id) => document.getElementById(id);

/** Write text only when it changed, so live regions do not re-announce the same words. */
function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

const state = {
  role: null, // "admin" | "read" once signed in
  selected: null, // endpoint whose queued requests show
  /** The latest endpoints listing, by name (the priorities panel shows the selected one's). */
  endpoints: new Map(),
  timer: null,
  /** Latest call number per resource: an older answer arriving late is dropped. */
  seq: { endpoints: 0, throughput: 0, queued: 0, limits: 0, dead: 0 },
  /** Whether the limits form holds the selected endpoint's limits yet (filled once per
   * selection and after a save, never over what the admin is typing). */
  limitsFilled: false,
  /** Where the status line's message came from: "refresh" messages clear on the next success. */
  statusSource: null,
  /** The Forget endpoint confirmation: null (closed), "ask" (first confirmation), "refused"
   * (the service answered 409: its message shows, with Forget anyway), "force" (second
   * confirmation, to forget it anyway). */
  forget: null,
  /** The service's answer to the last refused forget, shown while the confirmation is open. */
  forgetRefused: "",
};

// -- status line ---------------------------------------------------------------------------

function setStatus(text, kind = "info", source = "action") {
  const line = $("status");
  setText(line, text);
  line.className = `status ${kind}`;
  state.statusSource = text ? source : null;
}

function clearRefreshError() {
  if (state.statusSource === "refresh") setStatus("");
}

/** Say what went wrong; a 401 signs out. */
function report(error, what) {
  if (error.status === 401) {
    signOut("The token was not accepted (401). Sign in again.");
  } else if (error.status === 0) {
    setStatus(`Network error: ${error.message}. Retrying every ${REFRESH_MS / 1000} s.`, "error",
      "refresh");
  } else if (error.status === 403) {
    setStatus(`Not allowed (403): ${what} needs an admin token.`, "error", "action");
  } else {
    const code = error.status ? ` (${error.status} ${error.type})` : "";
    setStatus(`Could not ${what}${code}: ${error.message}`, "error", "refresh");
  }
}

// -- health ----------------------------------------------------------------------------------

function showHealth(status, detail, warnings) {
  $("health").className = `health ${status}`;
  setText($("health-state"), status);
  setText($("health-detail"), detail);
  const list = $("health-warnings");
  if (list.textContent !== warnings.join("")) {
    list.replaceChildren(...warnings.map((w) => el("li", { text: w })));
  }
}

function renderHealth(health) {
  const redis = health.redis ?? {};
  const persistence = (redis.persistence ?? []).join(", ") || "none";
  const parts = redis.ok
    ? [`Redis ${redis.version ?? "?"}`, `eviction ${redis.maxmemory_policy ?? "?"}`,
      `persistence ${persistence}`]
    : ["Redis does not answer"];
  if (health.version) parts.push(`prq ${health.version}`);
  const warnings = (redis.warnings ?? []).map(String);
  if (redis.error) warnings.push(String(redis.error));
  if (health.data_loss_events > 0) {
    warnings.push(`${health.data_loss_events} data-loss event(s) seen by this service`);
  }
  showHealth(String(health.status ?? "unknown"), parts.join(" · "), warnings);
}

async function refreshHealth() {
  try {
    renderHealth(await api.health());
  } catch (error) {
    showHealth("unknown", error.message, []);
  }
}

// -- endpoints table -------------------------------------------------------------------------

const ENDPOINT_CELLS = [
  ["depth", (e) => formatCount(e.depth)],
  ["in-flight", (e) => formatCount(e.in_flight)],
  ["oldest-age", (e) => formatAge(e.oldest_age_s)],
  ["receivers", (e) => formatCount(e.receivers)],
  ["enqueued-total", (e) => formatCount(e.enqueued_total)],
  ["dead-letters", (e) => formatCount(e.dead_letters)],
];

/** Rows are kept per endpoint and updated in place, so focus and selection survive refreshes. */
const endpointRows = new Map();

function endpointRow(endpoint) {
  let row = endpointRows.get(endpoint);
  if (row) return row;
  const button = el("button", {
    type: "button",
    class: "link",
    "data-testid": "endpoint-link",
    "aria-label": `Show queued requests of ${endpoint}`,
    text: endpoint,
  });
  row = el("tr", { "data-testid": "endpoint-row", onclick: () => select(endpoint) },
    el("th", { scope: "row" }, button),
    ...ENDPOINT_CELLS.map(([name]) => el("td", { class: "num", "data-testid": `endpoint-${name}` })));
  endpointRows.set(endpoint, row);
  return row;
}

function renderEndpoints(endpoints) {
  const body = $("endpoint-rows");
  const seen = new Set();
  endpoints.forEach((info, index) => {
    seen.add(info.endpoint);
    const row = endpointRow(info.endpoint);
    ENDPOINT_CELLS.forEach(([, value], i) => {
      setText(row.cells[i + 1], value(info));
    });
    const selected = info.endpoint === state.selected;
    row.classList.toggle("selected", selected);
    row.querySelector("button").toggleAttribute("aria-current", selected);
    if (body.children[index] !== row) body.insertBefore(row, body.children[index] ?? null);
  });
  for (const [endpoint, row] of endpointRows) {
    if (!seen.has(endpoint)) {
      row.remove();
      endpointRows.delete(endpoint);
    }
  }
  $("endpoints-empty").hidden = endpoints.length > 0;
  state.endpoints = new Map(endpoints.map((info) => [info.endpoint, info]));
  if (state.selected !== null) renderPriorities(state.endpoints.get(state.selected));
}

async function refreshEndpoints() {
  const seq = ++state.seq.endpoints;
  const endpoints = await api.endpoints();
  if (seq === state.seq.endpoints) renderEndpoints(endpoints);
}

async function refreshThroughput() {
  const seq = ++state.seq.throughput;
  const data = await api.throughput();
  if (seq !== state.seq.throughput) return;
  const minutes = Math.round((Number(data.window_s) || 600) / 60);
  $("throughput-caption").textContent = `enqueued per second, last ${minutes} minutes`;
  renderThroughput($("throughput"), data);
}

// -- queued requests -------------------------------------------------------------------------

const queuedRows = new Map();

function cancelButton(item) {
  return el("button", {
    type: "button",
    class: "danger",
    "data-testid": "cancel-button",
    "aria-label": `Cancel request ${item.id}`,
    text: "Cancel",
    onclick: (event) => cancel(item.id, event.currentTarget),
  });
}

function queuedRow(item) {
  let row = queuedRows.get(item.id);
  if (row) return row;
  row = el("tr", { "data-testid": "queued-row", "data-request-id": item.id },
    el("td", { class: "mono", "data-testid": "queued-id", text: item.id }),
    item.body_read === false
      ? el("td", { class: "muted", "data-testid": "queued-method", text: NOT_READ })
      : el("td", { "data-testid": "queued-method", text: item.method }),
    el("td", { class: "num", "data-testid": "queued-age" }),
    el("td", { "data-testid": "queued-producer", text: item.producer ?? "—" }),
    el("td", { class: "num", "data-testid": "queued-priority", text: formatCount(item.priority) }),
    el("td", { class: "num", "data-testid": "queued-size", text: formatBytes(item.body_bytes) }),
    state.role === "admin" ? el("td", { class: "actions" }, cancelButton(item)) : null);
  queuedRows.set(item.id, row);
  return row;
}

function renderQueued(page) {
  const body = $("queued-rows");
  const seen = new Set();
  page.items.forEach((item, index) => {
    seen.add(item.id);
    const row = queuedRow(item);
    row.cells[2].textContent = formatAge(item.age_s);
    if (body.children[index] !== row) body.insertBefore(row, body.children[index] ?? null);
  });
  for (const [id, row] of queuedRows) {
    if (!seen.has(id)) {
      row.remove();
      queuedRows.delete(id);
    }
  }
  const shown = page.items.length;
  $("queued").querySelector("[data-testid=queued-count]").textContent =
    shown < page.total ? `next ${shown} of ${formatCount(page.total)}` : `${shown} queued`;
  $("queued-empty").hidden = shown > 0;
}

function resetQueued() {
  queuedRows.clear();
  $("queued-rows").replaceChildren();
  $("queued").querySelector("[data-testid=queued-count]").textContent = "";
  $("queued-empty").hidden = true;
  const head = $("queued-head");
  head.querySelector(".actions")?.remove();
  if (state.role === "admin") head.append(el("th", { scope: "col", class: "actions", text: "Action" }));
}

async function refreshQueued() {
  if (state.selected === null) return;
  const seq = ++state.seq.queued;
  const endpoint = state.selected;
  const page = await api.queued(endpoint, 50);
  if (seq === state.seq.queued && endpoint === state.selected) renderQueued(page);
}

// -- limits ----------------------------------------------------------------------------------

/** A limit as shown: a count, or "none" when unset. */
function formatLimit(value) {
  return typeof value === "number" ? formatCount(value) : "none";
}

function renderLimits(limits) {
  setText($("queued").querySelector("[data-testid=limit-max-in-flight]"),
    formatLimit(limits.max_in_flight));
  setText($("queued").querySelector("[data-testid=limit-max-pending]"),
    formatLimit(limits.max_pending));
  if (!state.limitsFilled) {
    state.limitsFilled = true;
    $("limit-mif-input").value = typeof limits.max_in_flight === "number"
      ? String(limits.max_in_flight) : "";
    $("limit-mp-input").value = typeof limits.max_pending === "number"
      ? String(limits.max_pending) : "";
  }
}

function resetLimits() {
  state.limitsFilled = false;
  for (const name of ["limit-max-in-flight", "limit-max-pending"]) {
    $("queued").querySelector(`[data-testid=${name}]`).textContent = "…";
  }
  $("limit-mif-input").value = "";
  $("limit-mp-input").value = "";
  $("limits-form").hidden = state.role !== "admin";
}

async function refreshLimits() {
  if (state.selected === null) return;
  const seq = ++state.seq.limits;
  const endpoint = state.selected;
  const limits = await api.limits(endpoint);
  if (seq === state.seq.limits && endpoint === state.selected) renderLimits(limits);
}

/** An input's limit: null when empty, a whole number of 1 or more, else undefined (invalid). */
function limitOf(input) {
  const text = input.value.trim();
  if (text === "") return null;
  if (!/^[0-9]+$/.test(text)) return undefined;
  const value = Number(text);
  return Number.isSafeInteger(value) && value >= 1 ? value : undefined;
}

async function saveLimits(event) {
  event.preventDefault();
  const endpoint = state.selected;
  if (endpoint === null || state.role !== "admin") return;
  const wanted = {
    max_in_flight: limitOf($("limit-mif-input")),
    max_pending: limitOf($("limit-mp-input")),
  };
  if (wanted.max_in_flight === undefined || wanted.max_pending === undefined) {
    setStatus("Limits must be whole numbers of 1 or more (empty: no limit).", "error");
    return;
  }
  const button = $("limits-form").querySelector("button[type=submit]");
  button.disabled = true;
  let saved;
  try {
    saved = await api.setLimits(endpoint, wanted);
  } catch (error) {
    report(error, `set the limits of ${endpoint}`);
    return;
  } finally {
    button.disabled = false;
  }
  setStatus(`Limits of ${endpoint} set: max in flight ${formatLimit(saved.max_in_flight)}, ` +
    `max pending ${formatLimit(saved.max_pending)}.`, "ok");
  if (endpoint === state.selected) {
    state.seq.limits += 1; // an older read still on its way must not overwrite this
    state.limitsFilled = false;
    renderLimits(saved);
  }
  await refreshData();
}

// -- dead letters ----------------------------------------------------------------------------

const deadRows = new Map();

function replayButton(letter) {
  return el("button", {
    type: "button",
    "data-testid": "replay-button",
    "aria-label": `Replay dead letter ${letter.id}`,
    text: "Replay",
    onclick: (event) => replay(letter.id, event.currentTarget),
  });
}

/** The start of a dead letter's preview, on one line (control characters shown as spaces);
 * an ellipsis marks a preview cut short, here or by the service. */
function previewText(letter) {
  if (letter.body_read === false) return NOT_READ;
  const flat = String(letter.body_preview ?? "").replace(/[\u0000-\u001f\u007f-\u009f]/g, " ");
  const cut = flat.length > PREVIEW_CHARS || letter.body_preview_cut === true;
  return cut ? `${flat.slice(0, PREVIEW_CHARS)}…` : flat;
}

/** All of a dead letter's preview, for its tooltip. */
function previewTitle(letter) {
  if (letter.body_read === false) return NOT_READ;
  const preview = String(letter.body_preview ?? "");
  return letter.body_preview_cut === true ? `${preview}…` : preview;
}

function deadRow(letter) {
  let row = deadRows.get(letter.id);
  if (row) return row;
  row = el("tr", { "data-testid": "dead-row", "data-request-id": letter.id },
    el("td", { class: "mono", "data-testid": "dead-id", text: letter.id }),
    el("td", { class: "reason", "data-testid": "dead-reason", text: letter.reason }),
    el("td", { class: "num", "data-testid": "dead-attempts", text: formatCount(letter.attempts) }),
    el("td", { "data-testid": "dead-time", text: formatDateTime(letter.dead_at_ms) }),
    el("td", { class: "num", "data-testid": "dead-size", text: formatBytes(letter.body_bytes) }),
    el("td", {
      class: "mono preview",
      "data-testid": "dead-preview",
      title: previewTitle(letter),
      text: previewText(letter),
    }),
    state.role === "admin" ? el("td", { class: "actions" }, replayButton(letter)) : null);
  deadRows.set(letter.id, row);
  return row;
}

function renderDead(letters) {
  const body = $("dead-rows");
  const seen = new Set();
  letters.forEach((letter, index) => {
    seen.add(letter.id);
    const row = deadRow(letter);
    if (body.children[index] !== row) body.insertBefore(row, body.children[index] ?? null);
  });
  for (const [id, row] of deadRows) {
    if (!seen.has(id)) {
      row.remove();
      deadRows.delete(id);
    }
  }
  const shown = letters.length;
  setText($("queued").querySelector("[data-testid=dead-count]"),
    shown >= DEAD_LETTERS_SHOWN ? `${shown} newest` : `${shown} kept`);
  $("dead-empty").hidden = shown > 0;
  $("dead-purge").hidden = state.role !== "admin" || shown === 0;
  if (shown === 0) hidePurgeConfirm();
}

function resetDead() {
  deadRows.clear();
  $("dead-rows").replaceChildren();
  $("queued").querySelector("[data-testid=dead-count]").textContent = "";
  $("dead-empty").hidden = true;
  $("dead-purge").hidden = true;
  hidePurgeConfirm();
  const head = $("dead-head");
  head.querySelector(".actions")?.remove();
  if (state.role === "admin") head.append(el("th", { scope: "col", class: "actions", text: "Action" }));
}

async function refreshDead() {
  if (state.selected === null) return;
  const seq = ++state.seq.dead;
  const endpoint = state.selected;
  const letters = await api.deadLetters(endpoint, DEAD_LETTERS_SHOWN);
  if (seq === state.seq.dead && endpoint === state.selected) renderDead(letters);
}

async function replay(id, button) {
  const endpoint = state.selected;
  if (endpoint === null || state.role !== "admin") return;
  button.disabled = true;
  let answer;
  try {
    answer = await api.replayDeadLetter(endpoint, id);
  } catch (error) {
    button.disabled = false;
    report(error, `replay dead letter ${id}`);
    return;
  }
  if (answer.outcome === "replayed") setStatus(`Replayed dead letter ${id}: queued again.`, "ok");
  else if (answer.outcome === "live") {
    setStatus(`Dead letter ${id} dropped: the request is already queued or in flight.`, "warn");
  } else setStatus(`Dead letter ${id} was not found (replayed or purged already).`, "warn");
  await refreshData();
}

function hidePurgeConfirm() {
  $("dead-purge-confirm").hidden = true;
  $("dead-purge-all").hidden = false;
}

function askPurge() {
  const endpoint = state.selected;
  if (endpoint === null || state.role !== "admin") return;
  setText($("queued").querySelector("[data-testid=dead-purge-question]"),
    `Drop every dead letter of ${endpoint}?`);
  $("dead-purge-all").hidden = true;
  $("dead-purge-confirm").hidden = false;
  $("dead-purge-no").focus();
}

async function purgeAll() {
  const endpoint = state.selected;
  if (endpoint === null || state.role !== "admin") return;
  const yes = $("dead-purge-yes");
  yes.disabled = true;
  let answer;
  try {
    answer = await api.purgeDeadLetters(endpoint, null);
  } catch (error) {
    report(error, `purge the dead letters of ${endpoint}`);
    return;
  } finally {
    yes.disabled = false;
  }
  hidePurgeConfirm();
  setStatus(`Purged ${formatCount(answer.purged)} dead letter(s) of ${endpoint}.`, "ok");
  await refreshData();
}

// -- forgetting the endpoint -----------------------------------------------------------------

/** What forgetting does, asked before the first try (README: "Forgetting an endpoint"). */
function forgetQuestion(endpoint) {
  return `Forget ${endpoint}? It leaves the endpoint list and these views; no request, limit ` +
    "or dead letter is removed. A live receiver or a new enqueue lists it again.";
}

/** What forcing adds, asked once the service refused because the endpoint is busy. */
function forceQuestion(endpoint) {
  return `Forget ${endpoint} anyway? Its requests stay queued until taken or expired (while it ` +
    "is forgotten, a lookup by id alone does not find them), and a live receiver lists it " +
    "again within seconds.";
}

/** Show the button or the confirmation of `state.forget` (admins only). */
function renderForget() {
  const stage = state.forget;
  const endpoint = state.selected;
  $("forget-endpoint").hidden = state.role !== "admin" || endpoint === null || stage !== null;
  $("forget-confirm").hidden = stage === null;
  if (stage === null) return;
  const panel = $("forget-confirm");
  const refused = panel.querySelector("[data-testid=forget-refused]");
  refused.hidden = stage === "ask";
  setText(refused, state.forgetRefused);
  const question = panel.querySelector("[data-testid=forget-question]");
  question.hidden = stage === "refused";
  setText(question, stage === "force" ? forceQuestion(endpoint) : forgetQuestion(endpoint));
  setText($("forget-yes"), stage === "force" ? "Yes, forget anyway" : "Yes, forget it");
  $("forget-yes").hidden = stage === "refused";
  $("forget-anyway").hidden = stage !== "refused";
}

function setForget(stage, refused = "") {
  state.forget = stage;
  state.forgetRefused = refused;
  renderForget();
}

function askForget() {
  if (state.selected === null || state.role !== "admin") return;
  setForget("ask");
  $("forget-no").focus();
}

function askForce() {
  if (state.forget !== "refused") return;
  setForget("force", state.forgetRefused);
  $("forget-no").focus();
}

function keepEndpoint() {
  setForget(null);
  $("forget-endpoint").focus();
}

/** Back to the endpoint list, refreshed, saying what happened. */
async function leaveForgotten(endpoint, message, kind) {
  if (endpoint === state.selected) unselect();
  setStatus(message, kind);
  $("endpoints-title").focus();
  await refreshData();
}

function forgottenMessage(outcome) {
  const left = outcome.depth > 0 || outcome.in_flight > 0
    ? `; its ${formatCount(outcome.depth)} queued and ${formatCount(outcome.in_flight)} ` +
      "in-flight request(s) were left as they are."
    : ".";
  return `Forgot endpoint ${outcome.endpoint}${left}`;
}

async function forgetFailed(endpoint, error) {
  if (error.status === 409) {
    setForget("refused", `Not forgotten (409): ${error.message}`);
    $("forget-anyway").focus();
  } else if (error.status === 404) {
    await leaveForgotten(endpoint, `${endpoint} is not listed (forgotten already).`, "warn");
  } else {
    setForget(null);
    report(error, `forget ${endpoint}`);
  }
}

async function forget() {
  const endpoint = state.selected;
  if (endpoint === null || state.role !== "admin" || state.forget === null) return;
  const force = state.forget === "force";
  const yes = $("forget-yes");
  yes.disabled = true;
  let outcome;
  try {
    outcome = await api.forgetEndpoint(endpoint, force);
  } catch (error) {
    if (endpoint === state.selected) await forgetFailed(endpoint, error);
    else report(error, `forget ${endpoint}`);
    return;
  } finally {
    yes.disabled = false;
  }
  if (outcome.forgotten) await leaveForgotten(endpoint, forgottenMessage(outcome), "ok");
  else await leaveForgotten(endpoint, `${endpoint} is not listed (forgotten already).`, "warn");
}

// -- selection -------------------------------------------------------------------------------

function select(endpoint) {
  if (state.selected !== endpoint) {
    state.selected = endpoint;
    state.seq.queued += 1; // drop an answer still on its way for the previous endpoint
    state.seq.limits += 1;
    state.seq.dead += 1;
    resetQueued();
    resetLimits();
    resetDead();
    renderPriorities(state.endpoints.get(endpoint));
    state.forget = null;
  }
  renderForget();
  $("queued").hidden = false;
  $("queued").querySelector("[data-testid=queued-endpoint]").textContent = endpoint;
  for (const [name, row] of endpointRows) {
    row.classList.toggle("selected", name === endpoint);
    row.querySelector("button").toggleAttribute("aria-current", name === endpoint);
  }
  refreshQueued().catch((error) => report(error, "load the queued requests"));
  refreshLimits().catch((error) => report(error, "load the limits"));
  refreshDead().catch((error) => report(error, "load the dead letters"));
}

function unselect() {
  state.selected = null;
  state.seq.queued += 1;
  state.seq.limits += 1;
  state.seq.dead += 1;
  $("queued").hidden = true;
  resetQueued();
  resetLimits();
  resetDead();
  resetPriorities();
  setForget(null);
  for (const row of endpointRows.values()) {
    row.classList.remove("selected");
    row.querySelector("button").removeAttribute("aria-current");
  }
}

async function cancel(id, button) {
  button.disabled = true;
  try {
    const outcome = await api.cancel(id);
    if (outcome.cancelled) setStatus(`Cancelled request ${id}.`, "ok");
    else setStatus(`Request ${id} was not cancelled: it is ${outcome.state}.`, "warn");
  } catch (error) {
    button.disabled = false;
    report(error, `cancel request ${id}`);
    return;
  }
  await refreshData();
}

// -- refresh loop ----------------------------------------------------------------------------

async function refreshData() {
  const results = await Promise.allSettled([
    refreshEndpoints(), refreshThroughput(), refreshQueued(), refreshLimits(), refreshDead(),
  ]);
  const failed = results.find((r) => r.status === "rejected");
  if (failed) {
    report(failed.reason, "refresh");
    return;
  }
  clearRefreshError();
  $("dashboard").querySelector("[data-testid=updated]").textContent =
    `updated ${formatClock(new Date())}`;
}

async function tick() {
  clearTimeout(state.timer);
  const work = [refreshHealth()];
  if (state.role === null && loadToken()) work.push(learnRole());
  else if (state.role !== null && !document.hidden) work.push(refreshData());
  await Promise.allSettled(work);
  clearTimeout(state.timer);
  state.timer = setTimeout(tick, REFRESH_MS);
}

// -- signing in and out ----------------------------------------------------------------------

async function learnRole() {
  try {
    const who = await api.whoami();
    state.role = who.role === "admin" ? "admin" : "read";
  } catch (error) {
    report(error, "sign in");
    return;
  }
  clearRefreshError();
  $("signin").hidden = true;
  $("dashboard").hidden = false;
  $("session").hidden = false;
  $("session").querySelector("[data-testid=role]").textContent =
    state.role === "admin" ? "admin" : "read-only";
  resetQueued();
  resetLimits();
  resetDead();
  await refreshData();
}

function signOut(message, kind = "error") {
  clearToken();
  state.role = null;
  unselect();
  $("dashboard").hidden = true;
  $("session").hidden = true;
  $("signin").hidden = false;
  setStatus(message ?? "", kind);
  $("token-input").focus();
}

function onSignIn(event) {
  event.preventDefault();
  const input = $("token-input");
  const token = input.value.trim();
  if (!token) return;
  saveToken(token);
  input.value = "";
  setStatus("Signing in…", "info", "refresh");
  tick();
}

function start() {
  const fromFragment = tokenFromFragment();
  if (fromFragment) saveToken(fromFragment);
  $("signin-form").addEventListener("submit", onSignIn);
  $("sign-out").addEventListener("click", () => signOut("Signed out.", "info"));
  $("queued-close").addEventListener("click", unselect);
  $("limits-form").addEventListener("submit", saveLimits);
  $("dead-purge-all").addEventListener("click", askPurge);
  $("dead-purge-no").addEventListener("click", hidePurgeConfirm);
  $("dead-purge-yes").addEventListener("click", purgeAll);
  $("forget-endpoint").addEventListener("click", askForget);
  $("forget-yes").addEventListener("click", forget);
  $("forget-anyway").addEventListener("click", askForce);
  $("forget-no").addEventListener("click", keepEndpoint);
  // Once the admin types, the refresh no longer fills the form (it would overwrite the typing).
  $("limits-form").addEventListener("input", () => { state.limitsFilled = true; });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) tick();
  });
  if (!loadToken()) signOut();
  tick();
}

start();
