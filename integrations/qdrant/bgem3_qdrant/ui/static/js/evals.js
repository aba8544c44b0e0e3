// The evaluation tab: the JSON files of --eval-dir, and one file's figures as charts
// (nDCG@10, Recall@100, MRR@10 per mode, collections side by side, bytes per chunk).

import { api } from "./api.js";
import { el, clear, bytes } from "./dom.js";
import { PALETTE, groupedBars, horizontalBars } from "./charts.js";

function describe(c) {
  const pooling = c.colbert_pooling > 1 ? `pooled by ${c.colbert_pooling}` : "unpooled";
  return `${c.chunks.toLocaleString()} chunks · ColBERT ${c.colbert_dtype || "?"} ${pooling} · ${bytes(c.bytes_per_chunk)} per chunk`;
}

export function renderReport(container, report) {
  const series = report.collections.map((c, i) => ({ name: c.name, color: PALETTE[i % PALETTE.length] }));
  const modes = [];
  for (const c of report.collections) for (const m of Object.keys(c.modes)) if (!modes.includes(m)) modes.push(m);
  const legend = el(
    "ul",
    { class: "legend" },
    report.collections.map((c, i) => {
      const swatch = el("span", { class: "swatch" });
      swatch.style.backgroundColor = series[i].color;
      return el("li", {}, swatch, el("strong", {}, c.name), el("span", { class: "muted" }, ` — ${describe(c)}`));
    }),
  );
  const charts = report.measures.map((m) =>
    groupedBars({
      title: m.title,
      measure: m.key,
      groups: modes,
      series,
      value: (mode, s) => {
        const figures = report.collections[s].modes[mode];
        return figures ? figures[m.key] : null;
      },
    }),
  );
  const sizes = horizontalBars({
    title: "Bytes on disk per chunk",
    measure: "bytes_per_chunk",
    rows: report.collections.map((c, i) => ({ label: c.name, value: c.bytes_per_chunk, color: series[i].color, text: bytes(c.bytes_per_chunk) })),
  });
  const head = el(
    "div",
    { class: "report-head" },
    el("h2", {}, report.dataset || report.name),
    el("p", { class: "muted" }, `${report.name} · model ${report.model || "?"} · split ${report.split || "?"} · ${report.queries ?? "?"} queries`),
  );
  clear(container).append(head, legend, el("div", { class: "charts" }, charts, sizes));
}

export async function loadEvals(list, charts, showError) {
  let listing;
  try {
    listing = await api("/api/evals");
  } catch (err) {
    showError(err.message);
    return;
  }
  clear(list);
  if (!listing.folder) {
    list.append(el("p", { class: "empty" }, "Start the page with --eval-dir DIR to chart the JSON files `bgem3-qdrant eval ... --json FILE` writes."));
    return;
  }
  if (!listing.files.length) {
    list.append(el("p", { class: "empty" }, `No .json file in ${listing.folder} yet.`));
    return;
  }
  const open = async (name, button) => {
    for (const b of list.querySelectorAll("button")) b.classList.toggle("active", b === button);
    try {
      renderReport(charts, await api(`/api/evals/${encodeURIComponent(name)}`));
    } catch (err) {
      clear(charts);
      showError(err.message);
    }
  };
  for (const f of listing.files) {
    const label = f.ok ? `${f.name} — ${f.dataset || "?"}: ${f.collections.join(", ")}` : f.name;
    const button = el("button", { type: "button", class: f.ok ? "eval-file" : "eval-file bad", dataset: { name: f.name }, title: f.error || "" }, label);
    button.addEventListener("click", () => open(f.name, button));
    list.append(el("div", { class: "eval-entry" }, button, f.ok ? null : el("p", { class: "warn" }, f.error)));
  }
}
