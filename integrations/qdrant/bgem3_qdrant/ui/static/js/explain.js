// One explanation: the score per mode and its part of the combined score, the sparse terms as bars,
// the ColBERT alignment as a heatmap, and the passage with its aligned tokens highlighted.

import { el, clear, fmt, pct, TextOffsets, highlighted, inUnits } from "./dom.js";
import { heatmap, surface } from "./heatmap.js";
import { scoreNotes } from "./scoring.js";

const MODES = [
  ["dense", "Dense", "cosine of the two [CLS] vectors"],
  ["sparse", "Sparse", "sum of the shared tokens' weight products"],
  ["colbert", "ColBERT", "mean over query tokens of the best similarity"],
];

function card(title, note, ...body) {
  return el("section", { class: "card" }, el("h3", {}, title), note ? el("p", { class: "note" }, note) : null, ...body);
}

function bar(value, max, cls) {
  const b = el("span", { class: `bar ${cls}` });
  b.style.width = `${max > 0 ? (100 * Math.abs(value)) / max : 0}%`;
  return el("span", { class: "bar-track" }, b);
}

function scores(e, ctx) {
  const parts = e.all.parts;
  const total = MODES.reduce((s, [m]) => s + Math.abs(parts[m]), 0);
  const stack = el(
    "div",
    { class: "stack", title: "each mode's weighted part of the combined score" },
    MODES.map(([m, name]) => {
      const seg = el("span", { class: `seg seg-${m}`, title: `${name}: ${fmt(parts[m])}` }, name);
      seg.style.width = `${total > 0 ? (100 * Math.abs(parts[m])) / total : 0}%`;
      return seg;
    }),
  );
  const rows = MODES.map(([m, name, how]) =>
    el(
      "tr",
      { dataset: { mode: m } },
      el("th", { title: how }, name),
      el("td", { class: "num" }, fmt(e[m].score)),
      el("td", { class: "num" }, `× ${fmt(e.all.weights[m], 2)}`),
      el("td", { class: "num" }, fmt(parts[m])),
      el("td", { class: "wide" }, bar(parts[m], total, `bar-${m}`)),
    ),
  );
  const table = el(
    "table",
    { class: "scores" },
    el("thead", {}, el("tr", {}, el("th", {}, "mode"), el("th", {}, "score"), el("th", {}, "weight"), el("th", {}, "part"), el("th", {}, ""))),
    el("tbody", {}, rows),
    el("tfoot", {}, el("tr", { dataset: { mode: "all" } }, el("th", {}, "combined"), el("td", { class: "num total" }, fmt(e.all.score)), el("td", {}), el("td", {}), el("td", {}))),
  );
  const searched = ctx.hit
    ? el(
        "p",
        { class: "note" },
        "In the search (stored vectors): ",
        Object.entries(ctx.hit.scores).map(([k, v]) => `${k} ${fmt(v)}`).join(" · "),
        ctx.ranks ? ` — ranks ${Object.entries(ctx.ranks).map(([m, r]) => `${m} ${r}`).join(", ")}` : "",
      )
    : null;
  // Where the search's score of a mode is computed otherwise than the explanation's, say so beside them.
  const notes = ctx.hit ? scoreNotes(ctx.scoring).map((n) => el("p", { class: "caveat", dataset: { caveat: n.key } }, n.explanation)) : [];
  return card(
    "Score per mode",
    "compute_score's weighted sum (dense, sparse, ColBERT), recomputed from the two texts.",
    stack,
    table,
    searched,
    ...notes,
  );
}

function sparse(e) {
  const terms = e.sparse.terms;
  if (!terms.length) {
    return card("Sparse terms", null, el("p", { class: "empty" }, "No token is in both texts: the sparse score is 0."));
  }
  const max = Math.max(...terms.map((t) => Math.abs(t.product)));
  const list = el(
    "ol",
    { class: "terms" },
    terms.map((t) =>
      el(
        "li",
        { class: "term-row", dataset: { tokenId: String(t.token_id) }, title: `token ${t.token} (id ${t.token_id})` },
        el("span", { class: "term-text" }, t.text || t.token),
        bar(t.product, max, "bar-sparse"),
        el("span", { class: "num" }, fmt(t.product)),
        el("span", { class: "detail" }, `${fmt(t.query_weight, 3)} × ${fmt(t.passage_weight, 3)} · ${pct(t.share)}`),
      ),
    ),
  );
  const count = terms.length === 1 ? "1 shared token" : `${terms.length} shared tokens`;
  return card("Sparse terms", `${count}: query weight × passage weight, and share of ${fmt(e.sparse.score)}.`, list);
}

function colbert(e, q, p) {
  const { node, lo, hi } = heatmap(e, q, p);
  const matches = el(
    "table",
    { class: "matches" },
    el("thead", {}, el("tr", {}, el("th", {}, "query token"), el("th", {}, "best passage token"), el("th", {}, "similarity"), el("th", {}, "share"))),
    el(
      "tbody",
      {},
      e.colbert.matches.map((m) =>
        el(
          "tr",
          { class: "match", dataset: { q: String(m.query_token), p: String(m.passage_token) } },
          el("td", { class: "tok" }, surface(q, e.query.tokens[m.query_token])),
          el("td", { class: "tok" }, surface(p, e.passage.tokens[m.passage_token])),
          el("td", { class: "num" }, fmt(m.similarity, 3)),
          el("td", { class: "num" }, pct(m.share)),
        ),
      ),
    ),
  );
  const legend = el("p", { class: "note" }, `Cells from ${fmt(lo, 2)} (white) to ${fmt(hi, 2)} (blue); each row's best match outlined. ColBERT score ${fmt(e.colbert.score)} = mean of the best matches.`);
  return card("ColBERT alignment", null, legend, el("div", { class: "heatmap-scroll" }, node), el("details", { class: "matches-box" }, el("summary", {}, `Best match of each of the ${e.colbert.matches.length} query tokens`), matches));
}

// Passage tokens some query token aligns with best, one highlight per stretch of characters (UTF-16 units of
// the passage, whole grapheme clusters): the tokenizer's lone "▁" overlaps the next token's span, and two
// tokens can share a cluster, so overlapping tokens are one mark (data-p lists their indices).
function alignedRanges(e, q, p) {
  const found = [];
  const special = [];
  for (const m of e.colbert.matches) {
    const token = e.passage.tokens[m.passage_token];
    const from = surface(q, e.query.tokens[m.query_token]);
    if (token.stop <= token.start) special.push(`${token.token} ← ${from}`);
    else {
      const [start, stop] = p.range(token.start, token.stop);
      found.push({ start, stop, sim: m.similarity, from: [from], indices: [m.passage_token] });
    }
  }
  found.sort((a, b) => a.start - b.start || a.stop - b.stop);
  const merged = [];
  for (const f of found) {
    const last = merged[merged.length - 1];
    if (last && f.start < last.stop) {
      last.stop = Math.max(last.stop, f.stop);
      last.sim = Math.max(last.sim, f.sim);
      last.from.push(...f.from);
      last.indices.push(...f.indices);
    } else {
      merged.push(f);
    }
  }
  const bySpan = new Map(merged.map((v) => [v.start, { ...v, indices: new Set(v.indices) }]));
  const sims = [...bySpan.values()].map((v) => v.sim);
  const lo = Math.min(...sims, 0);
  const hi = Math.max(...sims, 1e-9);
  const ranges = [...bySpan.values()].map((v) => {
    const t = (v.sim - lo) / (hi - lo || 1);
    return {
      start: v.start,
      stop: v.stop,
      className: "aligned",
      color: `rgba(37, 99, 235, ${(0.15 + 0.55 * t).toFixed(3)})`,
      title: `best match of ${v.from.map((s) => `"${s}"`).join(", ")}: ${fmt(v.sim, 3)}`,
      data: { p: [...v.indices].join(" ") },
    };
  });
  return { ranges, special };
}

function passage(e, q, p) {
  const colbertView = alignedRanges(e, q, p);
  const sparseRanges = inUnits(
    p,
    e.sparse.terms.flatMap((t) =>
      t.passage_spans.map(([start, stop]) => ({ start, stop, className: "term", title: `${t.text || t.token}: ${fmt(t.product)}`, data: { tokenId: String(t.token_id) } })),
    ),
  );
  const body = el("p", { class: "passage" });
  const note = el("p", { class: "note" });
  const show = (which) => {
    const ranges = which === "colbert" ? colbertView.ranges : sparseRanges;
    clear(body).append(highlighted(p.text, ranges));
    note.textContent =
      which === "colbert"
        ? `Blue: passage tokens some query token aligns with best (darker: more similar).${colbertView.special.length ? ` Also: ${colbertView.special.join("; ")}.` : ""}`
        : "Amber: tokens the sparse score counts.";
    for (const b of buttons) b.classList.toggle("active", b.dataset.view === which);
  };
  const buttons = [
    el("button", { type: "button", class: "toggle", dataset: { view: "colbert" }, onclick: () => show("colbert") }, "ColBERT alignment"),
    el("button", { type: "button", class: "toggle", dataset: { view: "sparse" }, onclick: () => show("sparse") }, "Sparse terms"),
  ];
  show("colbert");
  const cut = e.passage.truncated ? el("p", { class: "warn" }, "The passage is longer than the model's limit: it was cut, as search cuts it.") : null;
  return card("The passage", null, el("div", { class: "toggles" }, buttons), note, body, cut);
}

// ctx: {title, subtitle, onClose, and for a hit of a search: hit, ranks, scoring (the search's)}.
export function renderExplanation(container, e, ctx) {
  // The API's token spans count code points; the page slices UTF-16 strings.
  const q = new TextOffsets(e.query.text);
  const p = new TextOffsets(e.passage.text);
  clear(container);
  container.hidden = false;
  container.append(
    el(
      "header",
      { class: "expl-head" },
      el("div", {}, el("h2", {}, ctx.title), ctx.subtitle ? el("p", { class: "muted" }, ctx.subtitle) : null),
      ctx.onClose ? el("button", { type: "button", class: "close", onclick: ctx.onClose, title: "Close the explanation" }, "Close") : null,
    ),
    el("div", { class: "expl-grid" }, scores(e, ctx), sparse(e)),
    colbert(e, q, p),
    passage(e, q, p),
  );
}
