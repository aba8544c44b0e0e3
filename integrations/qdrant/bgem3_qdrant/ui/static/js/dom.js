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

export const MODE_LABELS = { dense: "Dense", sparse: "Sparse", hybrid: "Hybrid (RRF)", rerank: "Rerank (ColBERT)" };
export const MODE_SHORT = { dense: "D", sparse: "S", hybrid: "H", rerank: "R" };

// Text with highlighted character ranges: ranges [{start, stop, className, strength, title, data}],
// non-overlapping after sorting (an earlier range wins an overlap). Returns a DocumentFragment.
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
