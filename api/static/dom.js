// Element building and number formatting. Data only ever becomes text nodes or attribute
// values (never markup), so endpoint names like `<script>` show as typed.

const SVG_NS = "http://www.w3.org/2000/svg";

function build(node, attrs, children) {
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "text") node.textContent = String(value);
    else if (typeof value === "function") node.addEventListener(name.replace(/^on/, ""), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

/** `el("td", {class: "num", text: 3})`: an HTML element; strings become text nodes. */
export function el(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** The same for SVG elements. */
export function svg(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

const integer = new Intl.NumberFormat("en", { maximumFractionDigits: 0 });
const decimal = new Intl.NumberFormat("en", { maximumFractionDigits: 2 });

export function formatCount(value) {
  return typeof value === "number" ? integer.format(value) : "—";
}

export function formatRate(value) {
  return decimal.format(value);
}

/** `0.4 s`, `12 s`, `3 m 04 s`, `2 h 05 m`; a dash for no value. */
export function formatAge(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds)) return "—";
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  const whole = Math.floor(seconds);
  if (whole < 60) return `${whole} s`;
  const pad = (n) => String(n).padStart(2, "0");
  if (whole < 3600) return `${Math.floor(whole / 60)} m ${pad(whole % 60)} s`;
  if (whole < 86400) return `${Math.floor(whole / 3600)} h ${pad(Math.floor(whole / 60) % 60)} m`;
  return `${Math.floor(whole / 86400)} d ${Math.floor(whole / 3600) % 24} h`;
}

export function formatBytes(bytes) {
  if (typeof bytes !== "number") return "—";
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
}

export function formatClock(date) {
  return date.toLocaleTimeString("en-GB", { hour12: false });
}

/** A time of day with its date, e.g. `2026-11-21 13:45:02`; a dash for no value. */
export function formatDateTime(ms) {
  if (typeof ms !== "number" || !Number.isFinite(ms) || ms <= 0) return "—";
  const date = new Date(ms);
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
    formatClock(date);
}
