// The throughput chart: enqueued requests per second per endpoint, drawn as SVG lines.
//
// Input is GET /api/throughput: {interval_s, window_s, series: [{endpoint, points: [[t_ms,
// per_s], ...]}]}. The x axis ends at the newest sample (the server's clock, so a skewed
// browser clock does not shift the lines) and spans the window.

import { el, formatRate, svg } from "./dom.js";

const WIDTH = 960;
const HEIGHT = 220;
const MARGIN = { top: 12, right: 16, bottom: 26, left: 48 };
/** Lines drawn at most; the busiest endpoints win, the rest are counted under the legend. */
const MAX_SERIES = 8;
const PALETTE = ["#2457a6", "#c2410c", "#15803d", "#7c3aed", "#b91c1c", "#0e7490", "#a16207",
  "#be185d"];

/** Colours stay with their endpoint from one refresh to the next. */
const colours = new Map();

function colourOf(endpoint) {
  if (!colours.has(endpoint)) colours.set(endpoint, PALETTE[colours.size % PALETTE.length]);
  return colours.get(endpoint);
}

/** The smallest of 1, 2, 2.5, 5 × 10^n that is at least `value` (and at least 1). */
function niceCeil(value) {
  if (!(value > 1)) return 1;
  const scale = 10 ** Math.floor(Math.log10(value));
  const step = [1, 2, 2.5, 5, 10].find((s) => s * scale >= value);
  return step * scale;
}

function minutesLabel(ms) {
  if (ms === 0) return "now";
  const minutes = ms / 60000;
  return `−${Number.isInteger(minutes) ? minutes : minutes.toFixed(1)} min`;
}

function axes(plot, window_ms, yMax) {
  const group = svg("g", { class: "axes" });
  for (let i = 0; i <= 4; i += 1) {
    const value = (yMax * i) / 4;
    const y = plot.y(value);
    group.append(
      svg("line", { x1: plot.left, x2: plot.right, y1: y, y2: y, class: "grid-line" }),
      svg("text", { x: plot.left - 6, y: y + 4, class: "y-label", text: formatRate(value) }),
    );
  }
  const stepMs = window_ms > 15 * 60000 ? 5 * 60000 : window_ms > 4 * 60000 ? 2 * 60000 : 60000;
  for (let ago = 0; ago <= window_ms + 1; ago += stepMs) {
    const x = plot.x(plot.end - ago);
    group.append(
      svg("line", { x1: x, x2: x, y1: plot.bottom, y2: plot.bottom + 4, class: "tick" }),
      svg("text", { x, y: HEIGHT - 8, class: "x-label", text: minutesLabel(ago) }),
    );
  }
  return group;
}

function line(plot, series) {
  const visible = series.points.filter(([t]) => t >= plot.start);
  if (visible.length === 0) return null;
  const attrs = {
    "data-endpoint": series.endpoint,
    "data-peak": Math.max(...visible.map(([, v]) => v)),
  };
  const colour = colourOf(series.endpoint);
  if (visible.length === 1) {
    const [[t, v]] = visible;
    return svg("circle", { ...attrs, cx: plot.x(t), cy: plot.y(v), r: 3, fill: colour });
  }
  return svg("polyline", {
    ...attrs,
    points: visible.map(([t, v]) => `${plot.x(t).toFixed(1)},${plot.y(v).toFixed(1)}`).join(" "),
    fill: "none",
    stroke: colour,
    "stroke-width": 2,
    "stroke-linejoin": "round",
  });
}

function legend(drawn, hidden) {
  const list = el("ul", { class: "legend", "data-testid": "throughput-legend" });
  for (const series of drawn) {
    const swatch = el("span", { class: "swatch", "aria-hidden": "true" });
    swatch.style.backgroundColor = colourOf(series.endpoint);
    const last = series.points.at(-1);
    list.append(
      el("li", { "data-testid": "throughput-series" },
        swatch,
        el("span", { class: "name", text: series.endpoint }),
        el("span", { class: "muted", text: ` ${formatRate(last ? last[1] : 0)}/s now` })),
    );
  }
  if (hidden > 0) list.append(el("li", { class: "muted", text: `and ${hidden} quieter endpoints` }));
  return list;
}

/** Replace the contents of `container` with the chart of `data`. */
export function renderThroughput(container, data) {
  const window_ms = Math.max(1, Number(data.window_s) || 600) * 1000;
  const series = (data.series ?? []).filter((s) => s.points && s.points.length > 0);
  if (series.length === 0) {
    container.replaceChildren(el("p", {
      class: "empty muted",
      "data-testid": "throughput-empty",
      text: `No samples yet; the service records one every ${data.interval_s ?? "few"} s.`,
    }));
    return;
  }
  const total = (s) => s.points.reduce((sum, [, v]) => sum + v, 0);
  const ranked = [...series].sort((a, b) => total(b) - total(a));
  const drawn = ranked.slice(0, MAX_SERIES).sort((a, b) => a.endpoint.localeCompare(b.endpoint));
  const end = Math.max(...series.map((s) => s.points.at(-1)[0]));
  const yMax = niceCeil(Math.max(...drawn.flatMap((s) => s.points.map(([, v]) => v))));

  const plot = {
    start: end - window_ms, end,
    left: MARGIN.left, right: WIDTH - MARGIN.right,
    top: MARGIN.top, bottom: HEIGHT - MARGIN.bottom,
  };
  plot.x = (t) => plot.left + ((t - plot.start) / window_ms) * (plot.right - plot.left);
  plot.y = (v) => plot.bottom - (v / yMax) * (plot.bottom - plot.top);

  const minutes = Math.round(window_ms / 60000);
  const chart = svg("svg", {
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: "img",
    "aria-labelledby": "throughput-svg-title",
    "data-testid": "throughput-svg",
  },
  svg("title", {
    id: "throughput-svg-title",
    text: `Requests enqueued per second, per endpoint, over the last ${minutes} minutes`,
  }),
  axes(plot, window_ms, yMax),
  svg("g", { class: "lines" }, ...drawn.map((s) => line(plot, s))));
  container.replaceChildren(chart, legend(drawn, ranked.length - drawn.length));
}
