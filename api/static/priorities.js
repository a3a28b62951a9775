// The selected endpoint's waiting requests per priority level, highest first (the order
// receivers take them in), each with its share of the waiting requests. The data comes with
// the endpoints listing (`priorities` of /api/endpoints), so this panel makes no call of its own.

import { el, formatCount } from "./dom.js";

const $ = (id) => document.getElementById(id);
const percent = new Intl.NumberFormat("en", { style: "percent", maximumFractionDigits: 0 });

function levelRow(level, total) {
  const share = total > 0 ? level.depth / total : 0;
  return el("tr", { "data-testid": "priority-row", "data-priority": level.priority },
    el("td", { class: "num", "data-testid": "priority-level", text: formatCount(level.priority) }),
    el("td", { class: "num", "data-testid": "priority-depth", text: formatCount(level.depth) }),
    el("td", {},
      el("div", { class: "share" },
        el("meter", {
          min: 0, max: 1, value: share,
          "aria-label": `Share of the waiting requests at priority ${level.priority}`,
        }),
        el("span", { class: "num", "data-testid": "priority-share", text: percent.format(share) }))));
}

/** Show `info`'s levels (an EndpointInfo, or undefined while the listing has not come yet). */
export function renderPriorities(info) {
  const levels = Array.isArray(info?.priorities) ? info.priorities : [];
  const shown = levels.reduce((sum, level) => sum + level.depth, 0);
  $("priority-rows").replaceChildren(...levels.map((level) => levelRow(level, shown)));
  $("priorities-empty").hidden = info === undefined || levels.length > 0;
  const more = $("priorities-more");
  const below = typeof info?.depth === "number" ? info.depth - shown : 0;
  more.hidden = below <= 0 || levels.length === 0;
  more.textContent = more.hidden ? "" :
    `${formatCount(below)} more wait at lower priorities than the ${levels.length} shown.`;
}

/** Empty the panel (another endpoint was selected, or none). */
export function resetPriorities() {
  $("priority-rows").replaceChildren();
  $("priorities-empty").hidden = true;
  $("priorities-more").hidden = true;
}
