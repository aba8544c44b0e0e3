// Building DOM and SVG nodes. Text always goes in as text (textContent / text nodes), never as HTML:
// a document's text may hold <script> or <img onerror=...>, and it must be shown, not run.

const SVG_NS = "http://www.w3.org/2000/svg";

function append(node, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// el("div", {class: "hit", dataset: {id}, onclick: f}, "text", otherNode)
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "style") Object.assign(node.style, value); // CSSOM: allowed by style-src 'self'
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  return append(node, children);
}

export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.setAttribute("class", value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, String(value));
  }
  return append(node, children);
}

export function clear(node) {
  node.replaceChildren();
  return node;
}

export function fmt(value, digits = 4) {
  return value === null || value === undefined || Number.isNaN(value) ? "–" : Number(value).toFixed(digits);
}

export function pct(value) {
  return `${(100 * value).toFixed(value >= 0.1 ? 0 : 1)}%`;
}

export function ms(value) {
  return `${Number(value).toFixed(value < 10 ? 1 : 0)} ms`;
}

export function bytes(value) {
  if (value === null || value === undefined) return "not visible (a server)";
  return value >= 1024 * 1024 ? `${(value / 1048576).toFixed(1)} MiB` : `${(value / 1024).toFixed(1)} KiB`;
}

export const MODE_LABELS = {
  dense: "Dense",
  sparse: "Sparse",
  hybrid: "Hybrid (RRF)",
  rerank: "Rerank (ColBERT)",
  cross_encoder: "Cross-encoder (over Rerank)", // `bgem3-qdrant ui --reranker MODEL`
};
export const MODE_SHORT = { dense: "D", sparse: "S", hybrid: "H", rerank: "R", cross_encoder: "X" };

// Offsets in the API's answers count Unicode code points (Python's str indices, the tokenizer's spans); a
// JavaScript string counts UTF-16 code units, two for a character outside the Basic Multilingual Plane (an
// emoji, a CJK Extension B ideograph, a mathematical letter such as 𝔘). `TextOffsets` turns one into the
// other and widens a range to whole grapheme clusters, so no mark or cut splits a surrogate pair or parts a
// combining mark ("e\u0301") from its letter.
const SURROGATE = /[\uD800-\uDFFF]/;
// Below U+0300 (the first combining mark) every code point is a cluster of its own, CR LF aside.
const CLUSTERS = /[\u0300-\uFFFF]|\r\n/;
const GRAPHEMES = typeof Intl === "object" && Intl.Segmenter ? new Intl.Segmenter(undefined, { granularity: "grapheme" }) : null;

export class TextOffsets {
  constructor(text) {
    this.text = text;
    // code point i -> UTF-16 index i; a table only when some character takes two units.
    this.table = null;
    if (SURROGATE.test(text)) {
      const table = [0];
      let at = 0;
      for (const ch of text) table.push((at += ch.length));
      this.table = Int32Array.from(table);
    }
    this.segments = GRAPHEMES && CLUSTERS.test(text) ? GRAPHEMES.segment(text) : null;
  }

  // The UTF-16 index of code point `cp` (clamped to the text).
  unit(cp) {
    const i = Math.max(0, Math.min(cp, this.table ? this.table.length - 1 : this.text.length));
    return this.table ? this.table[i] : i;
  }

  // The start of the grapheme cluster holding UTF-16 index i (i itself at a boundary).
  clusterStart(i) {
    if (i <= 0 || i >= this.text.length) return Math.max(0, Math.min(i, this.text.length));
    if (this.segments) return this.segments.containing(i).index;
    const c = this.text.charCodeAt(i);
    return c >= 0xdc00 && c <= 0xdfff ? i - 1 : i; // never between the two halves of a surrogate pair
  }

  // The end of the grapheme cluster holding UTF-16 index i - 1 (i itself at a boundary).
  clusterEnd(i) {
    const start = this.clusterStart(i);
    if (start === i || !this.segments) return start === i ? i : i + 1;
    const s = this.segments.containing(i);
    return s.index + s.segment.length;
  }

  // Code point range [start, stop) -> UTF-16 range [a, b), widened to whole grapheme clusters.
  range(start, stop) {
    const a = this.unit(start);
    const b = this.unit(stop);
    return b > a ? [this.clusterStart(a), this.clusterEnd(b)] : [a, a];
  }

  // The characters of code points [start, stop), whole clusters.
  slice(start, stop) {
    const [a, b] = this.range(start, stop);
    return this.text.slice(a, b);
  }
}

// Ranges {start, stop, ...} in code points -> the same in UTF-16 units of `offsets.text`.
export function inUnits(offsets, ranges) {
  return ranges.map((r) => {
    const [start, stop] = offsets.range(r.start, r.stop);
    return { ...r, start, stop };
  });
}

// At most `max` grapheme clusters of `text`, "…" ending a cut one.
export function clip(text, max) {
  const parts = GRAPHEMES ? Array.from(GRAPHEMES.segment(text), (s) => s.segment) : Array.from(text);
  return parts.length > max ? `${parts.slice(0, max - 1).join("")}…` : text;
}

// Text with highlighted ranges [{start, stop, className, color, title, data}] in UTF-16 units (JavaScript
// string indices: convert the API's code points with `inUnits` first), non-overlapping after sorting (an
// earlier range wins an overlap). Returns a DocumentFragment.
export function highlighted(text, ranges) {
  const frag = document.createDocumentFragment();
  const sorted = ranges.filter((r) => r.stop > r.start).sort((a, b) => a.start - b.start);
  let at = 0;
  for (const r of sorted) {
    if (r.start < at) continue;
    if (r.start > at) frag.append(document.createTextNode(text.slice(at, r.start)));
    const mark = el("mark", { class: r.className, title: r.title, dataset: r.data || {} }, text.slice(r.start, r.stop));
    if (r.color) mark.style.backgroundColor = r.color;
    frag.append(mark);
    at = r.stop;
  }
  if (at < text.length) frag.append(document.createTextNode(text.slice(at)));
  return frag;
}
