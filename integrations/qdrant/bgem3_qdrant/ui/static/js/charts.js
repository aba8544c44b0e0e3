// Bar charts in plain SVG: grouped bars (one group per mode, one bar per collection) and horizontal bars.

import { el, svg, fmt } from "./dom.js";

export const PALETTE = ["#2563eb", "#ea580c", "#059669", "#9333ea", "#db2777", "#0891b2", "#65a30d", "#b45309"];

function niceMax(values) {
  const max = Math.max(0, ...values.filter((v) => v !== null && Number.isFinite(v)));
  if (max <= 0) return 1;
  const step = max > 0.5 ? 0.2 : max > 0.2 ? 0.1 : 0.05;
  return Math.min(1, Math.ceil(max / step) * step) || max;
}

// groups: ["dense", ...]; series: [{name, color}]; value(group, seriesIndex) -> number or null.
export function groupedBars({ title, measure, groups, series, value }) {
  const barW = series.length > 4 ? 12 : series.length > 2 ? 18 : 24;
  const gap = 20;
  const groupW = series.length * barW + gap;
  const left = 44;
  const top = 18;
  const plotH = 170;
  const width = left + groups.length * groupW + 10;
  const height = top + plotH + 30;
  const values = groups.flatMap((g) => series.map((_, s) => value(g, s)));
  const max = niceMax(values);
  const root = svg("svg", { class: "chart-svg", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title });
  for (let k = 0; k <= 4; k += 1) {
    const v = (max * k) / 4;
    const y = top + plotH - (plotH * k) / 4;
    root.append(svg("line", { class: "grid", x1: left, x2: width - 6, y1: y, y2: y }));
    root.append(svg("text", { class: "axis", x: left - 6, y: y + 4, "text-anchor": "end" }, fmt(v, 2)));
  }
  groups.forEach((g, gi) => {
    const x0 = left + gi * groupW + gap / 2;
    series.forEach((s, si) => {
      const v = value(g, si);
      if (v === null || v === undefined) return;
      const h = Math.max(0, (plotH * v) / max);
      const x = x0 + si * barW;
      root.append(
        svg(
          "rect",
          {
            class: "bar-rect",
            x,
            y: top + plotH - h,
            width: barW - 2,
            height: h,
            fill: s.color,
            dataset: { mode: g, collection: s.name, measure, value: String(v) },
          },
          svg("title", {}, `${s.name} · ${g}: ${fmt(v)}`),
        ),
      );
      if (barW >= 18) {
        root.append(svg("text", { class: "bar-value", x: x + (barW - 2) / 2, y: top + plotH - h - 3, "text-anchor": "middle" }, fmt(v, 2)));
      }
    });
    root.append(svg("text", { class: "group", x: x0 + (series.length * barW) / 2, y: top + plotH + 16, "text-anchor": "middle" }, g));
  });
  return el("figure", { class: "chart", dataset: { measure } }, el("figcaption", {}, title), root);
}

// rows: [{label, value, color, text}] drawn as horizontal bars scaled to the largest.
export function horizontalBars({ title, rows, measure }) {
  const max = Math.max(0, ...rows.map((r) => r.value || 0)) || 1;
  const list = el(
    "div",
    { class: "hbars" },
    rows.map((r) => {
      const b = el("span", { class: "hbar" });
      b.style.width = `${r.value ? (100 * r.value) / max : 0}%`;
      b.style.backgroundColor = r.color;
      return el(
        "div",
        { class: "hbar-row", dataset: { collection: r.label, measure } },
        el("span", { class: "hbar-label" }, r.label),
        el("span", { class: "bar-track" }, b),
        el("span", { class: "num" }, r.text),
      );
    }),
  );
  return el("figure", { class: "chart", dataset: { measure } }, el("figcaption", {}, title), list);
}
