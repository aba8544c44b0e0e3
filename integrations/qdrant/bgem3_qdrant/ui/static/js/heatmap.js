// The ColBERT alignment as a heatmap: one row per query vector, one column per passage vector, each
// cell the similarity of the two; each row's best match (what MaxSim keeps) is outlined.

import { svg, fmt, clip } from "./dom.js";

// Vector i of a text is its token i + 1 (FlagEmbedding drops the <s> vector and keeps </s>).
// A lone "▁" (a word start the tokenizer splits off) shares its span with the next token: show it as "▁".
// `offsets`: the text's TextOffsets (a token's start and stop count code points).
export function surface(offsets, token) {
  if (token.stop <= token.start || token.token === "▁") return token.token;
  return offsets.slice(token.start, token.stop);
}

function label(value, max) {
  return clip(value.replace(/\s+/g, " ").trim() || "␣", max);
}

// White to deep blue.
function shade(t) {
  const lo = [248, 250, 252];
  const hi = [30, 64, 175];
  const c = lo.map((a, k) => Math.round(a + (hi[k] - a) * t));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}

// q, p: the query's and the passage's TextOffsets.
export function heatmap(e, q, p) {
  const matrix = e.colbert.matrix || [];
  const rows = matrix.length;
  const cols = rows ? matrix[0].length : 0;
  const qLabels = Array.from({ length: rows }, (_, i) => label(surface(q, e.query.tokens[i + 1]), 14));
  const pLabels = Array.from({ length: cols }, (_, j) => label(surface(p, e.passage.tokens[j + 1]), 12));
  const cell = cols > 160 ? 10 : 16;
  const left = 12 + 7 * Math.max(4, ...qLabels.map((s) => s.length));
  const top = 14 + 5.2 * Math.max(4, ...pLabels.map((s) => s.length));
  const width = left + cols * cell + 8;
  const height = top + rows * cell + 8;
  let lo = Infinity;
  let hi = -Infinity;
  for (const row of matrix) {
    for (const v of row) {
      lo = Math.min(lo, v);
      hi = Math.max(hi, v);
    }
  }
  const span = hi > lo ? hi - lo : 1;
  const best = new Map(e.colbert.matches.map((m) => [m.query_token - 1, m.passage_token - 1]));

  const root = svg("svg", {
    class: "heatmap",
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-label": `ColBERT similarities: ${rows} query tokens x ${cols} passage tokens`,
    dataset: { rows: String(rows), cols: String(cols) },
  });
  qLabels.forEach((s, i) => {
    root.append(
      svg("text", { class: "q-label", x: left - 6, y: top + i * cell + cell * 0.72, "text-anchor": "end" }, s),
    );
  });
  pLabels.forEach((s, j) => {
    const x = left + j * cell + cell * 0.7;
    root.append(svg("text", { class: "p-label", x, y: top - 6, transform: `rotate(-60 ${x} ${top - 6})` }, s));
  });
  const cells = svg("g", { class: "cells" });
  matrix.forEach((row, i) => {
    row.forEach((v, j) => {
      const isBest = best.get(i) === j;
      cells.append(
        svg(
          "rect",
          {
            class: isBest ? "cell best-cell" : "cell",
            x: left + j * cell,
            y: top + i * cell,
            width: cell,
            height: cell,
            fill: shade((v - lo) / span),
            dataset: { q: String(i + 1), p: String(j + 1) },
          },
          svg("title", {}, `${qLabels[i]} × ${pLabels[j]}: ${fmt(v, 3)}${isBest ? " (best match)" : ""}`),
        ),
      );
    });
  });
  root.append(cells);
  // The best matches on top, outlined, so no neighbour's fill covers their border.
  const marks = svg("g", { class: "best" });
  for (const [i, j] of best) {
    marks.append(
      svg("rect", {
        class: "best-mark",
        x: left + j * cell + 1,
        y: top + i * cell + 1,
        width: cell - 2,
        height: cell - 2,
        dataset: { q: String(i + 1), p: String(j + 1) },
      }),
    );
  }
  root.append(marks);
  return { node: root, lo, hi };
}
