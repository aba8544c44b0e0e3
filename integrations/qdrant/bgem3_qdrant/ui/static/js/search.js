// The hits of the four modes side by side: rank, score, source, the text with its matched sparse terms
// highlighted by weight, and where the same chunk ranks in each mode.

import { el, clear, fmt, pct, MODE_LABELS, MODE_SHORT, TextOffsets, highlighted, inUnits } from "./dom.js";
import { scoreNotes } from "./scoring.js";

// The sparse highlight's colour (amber), its opacity growing with the term's product.
function termColor(product, maxProduct) {
  const strength = maxProduct > 0 ? Math.max(0, product) / maxProduct : 0;
  return `rgba(245, 158, 11, ${(0.18 + 0.62 * strength).toFixed(3)})`;
}

// The terms' spans (code points) as ranges of `offsets.text` in UTF-16 units.
function termRanges(offsets, terms, maxProduct) {
  return inUnits(
    offsets,
    terms.flatMap((t) =>
      t.spans.map(([start, stop]) => ({
        start,
        stop,
        className: "term",
        color: termColor(t.product, maxProduct),
        title: `${t.text || t.token}: ${fmt(t.product)} (${pct(t.share)} of the sparse score)`,
        data: { tokenId: String(t.token_id) },
      })),
    ),
  );
}

// A card shows at most this many characters (UTF-16 units) of a chunk, from shortly before its first matched
// term (a 512-token chunk is about 2,000 characters; laying out all of them in every card costs more than
// the search). The explanation shows the whole text. The cuts fall between grapheme clusters.
const SNIPPET_CHARS = 420;

// {text, ranges, cut: [before, after], start, stop}: the part of offsets.text shown, ranges (UTF-16) moved
// into it. Exported for the browser tests.
export function snippet(offsets, ranges) {
  const text = offsets.text;
  if (text.length <= SNIPPET_CHARS) return { text, ranges, cut: [false, false], start: 0, stop: text.length };
  const first = ranges.reduce((m, r) => Math.min(m, r.start), Infinity);
  let start = Number.isFinite(first) ? Math.max(0, first - 80) : 0;
  if (start > 0) {
    const space = text.lastIndexOf(" ", start);
    start = space > start - 40 ? space + 1 : start;
  }
  start = offsets.clusterStart(Math.max(0, Math.min(start, text.length - SNIPPET_CHARS)));
  const stop = offsets.clusterStart(Math.min(text.length, start + SNIPPET_CHARS));
  const inside = ranges
    .filter((r) => r.start >= start && r.stop <= stop)
    .map((r) => ({ ...r, start: r.start - start, stop: r.stop - start }));
  return { text: text.slice(start, stop), ranges: inside, cut: [start > 0, stop < text.length], start, stop };
}

function cardText(text, terms, maxProduct) {
  const offsets = new TextOffsets(text);
  const s = snippet(offsets, termRanges(offsets, terms, maxProduct));
  return el("p", { class: "text", title: s.cut.some(Boolean) ? "part of the chunk: open it for the whole text" : null },
    s.cut[0] ? "… " : null, highlighted(s.text, s.ranges), s.cut[1] ? " …" : null);
}

// A document's name: its id when it has its own, else its file's name (the full path is the tooltip).
export function where(hit) {
  const file = (hit.source || "").split(/[\\/]/).pop();
  const place = hit.doc_id && hit.doc_id !== hit.source ? hit.doc_id : file || "–";
  return hit.chunk_index === null || hit.chunk_index === undefined ? place : `${place} #${hit.chunk_index}`;
}

function sameChunk(container, id, on) {
  for (const card of container.querySelectorAll(`.hit[data-id="${CSS.escape(id)}"]`)) {
    card.classList.toggle("same", on);
  }
}

function hitCard(container, mode, hit, ranks, maxProduct, onOpen, shown) {
  // A badge per mode this search ran (the cross-encoder's only when the page was started with --reranker).
  const badges = Object.keys(MODE_SHORT).filter((m) => shown.includes(m)).map((m) => {
    const rank = ranks[hit.id][m];
    const cls = ["rank-badge", `badge-${m}`, m === mode ? "self" : "", rank ? "" : "absent"].join(" ");
    const title = rank ? `${MODE_LABELS[m]}: rank ${rank}` : `${MODE_LABELS[m]}: not in its hits`;
    return el("span", { class: cls, title, dataset: { mode: m } }, `${MODE_SHORT[m]} ${rank ?? "–"}`);
  });
  const stages = Object.entries(hit.scores).map(([k, v]) => `${k} ${fmt(v, 3)}`).join(" · ");
  const open = () => onOpen(hit, mode);
  const card = el(
    "li",
    {
      class: "hit",
      tabindex: 0,
      title: "Open: why this hit came back",
      dataset: { id: hit.id, rank: String(hit.rank), mode },
      onclick: open,
      onkeydown: (ev) => {
        if (ev.key === "Enter" || ev.key === " ") {
          ev.preventDefault();
          open();
        }
      },
      onmouseenter: () => sameChunk(container, hit.id, true),
      onmouseleave: () => sameChunk(container, hit.id, false),
    },
    el(
      "div",
      { class: "hit-head" },
      el("span", { class: "rank" }, `${hit.rank}`),
      el("span", { class: "source", title: hit.source || "" }, where(hit)),
      el("span", { class: "score", title: "the mode's score" }, fmt(hit.score)),
    ),
    cardText(hit.text, hit.terms, maxProduct),
    el("div", { class: "hit-foot" }, el("div", { class: "badges" }, badges), el("span", { class: "stages" }, stages)),
  );
  return card;
}

export function renderResults(container, data, onOpen) {
  const modes = Object.keys(data.modes);
  const ranks = {};
  let maxProduct = 0;
  for (const mode of modes) {
    for (const hit of data.modes[mode]) {
      (ranks[hit.id] ||= {})[mode] = hit.rank;
      for (const t of hit.terms) maxProduct = Math.max(maxProduct, t.product);
    }
  }
  const notes = scoreNotes(data.scoring);
  const columns = modes.map((mode) => {
    const hits = data.modes[mode];
    return el(
      "section",
      { class: `mode-col mode-${mode}`, dataset: { mode } },
      el("h2", {}, MODE_LABELS[mode] || mode, el("span", { class: "count" }, hits.length === 1 ? "1 hit" : `${hits.length} hits`)),
      notes.filter((n) => n.mode === mode).map((n) => el("p", { class: "caveat", dataset: { caveat: n.key } }, n.column)),
      hits.length
        ? el("ol", { class: "hits" }, hits.map((h) => hitCard(container, mode, h, ranks, maxProduct, onOpen, modes)))
        : el("p", { class: "empty" }, "No hits (a filter that matches nothing, or no shared token for sparse)."),
    );
  });
  clear(container).append(...columns);
}
