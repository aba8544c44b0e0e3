// The page: wiring of the tabs, the collection picker, the search form, hit explanations, the pair box,
// the evaluation charts, and one banner for every error the API answers with (the page keeps working).

import { api, ApiError, setKey } from "./api.js";
import { el, clear, ms, MODE_LABELS } from "./dom.js";
import { renderResults, where } from "./search.js";
import { renderExplanation } from "./explain.js";
import { loadEvals } from "./evals.js";

const $ = (id) => document.getElementById(id);
const state = { collections: [], lastSearch: null, retry: null, enterAt: null };

function showError(message) {
  const banner = $("banner");
  clear(banner).append(
    el("span", { class: "banner-text" }, message),
    el("button", { type: "button", class: "dismiss", title: "Dismiss", onclick: hideError }, "×"),
  );
  banner.hidden = false;
}

function hideError() {
  $("banner").hidden = true;
}

// A 401 opens the key form; anything else is one line in the banner.
function failed(err, retry) {
  if (err instanceof ApiError && err.status === 401) {
    state.retry = retry;
    $("key-form").hidden = false;
    $("key").focus();
  }
  showError(err.message);
}

function nextPaint() {
  return new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
}

function collectionInfo(c) {
  const box = clear($("collection-info"));
  if (!c) return;
  if (c.chunks !== undefined) {
    const pooling = c.pooling > 1 ? `ColBERT pooled by ${c.pooling}` : "ColBERT unpooled";
    const facts = [
      ["chunks", Number(c.chunks).toLocaleString()],
      ["model", c.model || "not recorded"],
      ["precision", c.precision || "–"],
      ["pooling", pooling],
      ["ColBERT storage", c.colbert_dtype],
      ["sparse", c.sparse_modifier === "idf" ? "IDF-weighted by Qdrant" : "reference lexical score"],
    ];
    box.append(...facts.map(([k, v]) => el("span", { class: "fact", dataset: { fact: k } }, el("span", { class: "k" }, k), " ", v)));
  }
  if (c.problem) box.append(el("p", { class: "warn" }, c.problem));
  const options = clear($("filter-options"));
  for (const f of c.filters || []) options.append(el("option", { value: f }));
}

async function loadCollections() {
  let data;
  try {
    data = await api("/api/collections");
  } catch (err) {
    failed(err, loadCollections);
    const select = clear($("collection"));
    select.append(el("option", { value: "" }, "(store not available)"));
    $("collection-info").replaceChildren(
      el("button", { type: "button", class: "retry", onclick: () => { hideError(); loadCollections(); } }, "Try again"),
    );
    return;
  }
  state.collections = data.collections;
  const select = clear($("collection"));
  if (!data.collections.length) {
    select.append(el("option", { value: "" }, "(no collection)"));
    collectionInfo(null);
    showError("The store holds no collection yet: fill one with `bgem3-qdrant ingest PATH --collection NAME`.");
    return;
  }
  for (const c of data.collections) {
    const label = c.problem ? `⚠ ${c.name}` : `${c.name} (${Number(c.chunks).toLocaleString()} chunks)`;
    select.append(el("option", { value: c.name }, label));
  }
  const preferred = data.collections.find((c) => !c.problem) || data.collections[0];
  select.value = preferred.name;
  collectionInfo(preferred);
}

async function loadInfo() {
  try {
    const info = await api("/api/info");
    const about = `${info.store} · ${info.model}${info.precision ? ` (${info.precision})` : ""}`;
    $("store-info").textContent = about;
    $("store-info").title = about;
    $("pair-limit").textContent = `up to ${info.limits.max_passage_chars.toLocaleString()} characters`;
  } catch (err) {
    failed(err, loadInfo);
  }
}

function filters() {
  return $("filter").value.split(";").map((s) => s.trim()).filter(Boolean);
}

async function search(ev) {
  ev.preventDefault();
  const started = state.enterAt ?? performance.now();
  state.enterAt = null;
  hideError();
  const results = $("results");
  const status = $("search-status");
  const request = {
    collection: $("collection").value,
    query: $("query").value,
    filters: filters(),
    limit: Number($("limit").value),
  };
  status.textContent = "Searching…";
  results.setAttribute("aria-busy", "true");
  let data;
  try {
    data = await api("/api/search", request);
  } catch (err) {
    status.textContent = "";
    results.removeAttribute("aria-busy");
    failed(err, () => search(new Event("submit")));
    return;
  }
  const answered = performance.now();
  state.lastSearch = data;
  $("explanation").hidden = true;
  renderResults(results, data, openHit);
  const built = performance.now();
  await nextPaint();
  const drawn = performance.now() - started;
  const t = data.timing;
  // The phases, for benchmarks/qdrant_ui_page.py: Enter -> answer parsed -> DOM built -> painted.
  results.dataset.requestMs = (answered - started).toFixed(2);
  results.dataset.renderMs = (built - answered).toFixed(2);
  results.dataset.clientMs = drawn.toFixed(2);
  results.dataset.serverMs = String(t.server_ms);
  results.dataset.searchedMs = String(t.searched_ms);
  results.dataset.highlightMs = String(t.highlight_ms);
  results.dataset.query = data.query;
  results.removeAttribute("aria-busy");
  status.textContent =
    `${Object.keys(data.modes).length} modes · search ${ms(t.searched_ms)} (query embedding ${ms(t.embed_ms)}) · ` +
    `highlighting ${ms(t.highlight_ms)} · on the page ${ms(drawn)} from Enter`;
  for (const w of data.warnings) showError(w);
}

async function openHit(hit, mode) {
  const data = state.lastSearch;
  const box = $("explanation");
  const ranks = {};
  for (const [m, hits] of Object.entries(data.modes)) {
    const found = hits.find((h) => h.id === hit.id);
    if (found) ranks[m] = found.rank;
  }
  clear(box).append(el("p", { class: "muted loading" }, "Encoding the query and this chunk together…"));
  box.hidden = false;
  box.scrollIntoView({ behavior: "instant", block: "start" });
  try {
    const e = await api("/api/explain", { collection: data.collection, id: hit.id, query: data.query });
    renderExplanation(box, e, {
      title: `Why ${where(hit)} came back`,
      subtitle: `for “${data.query}” — opened from ${MODE_LABELS[mode] || mode}, rank ${hit.rank}`,
      hit,
      ranks,
      scoring: data.scoring,
      onClose: () => {
        box.hidden = true;
      },
    });
    box.dataset.id = hit.id;
    box.scrollIntoView({ behavior: "instant", block: "start" });
  } catch (err) {
    box.hidden = true;
    failed(err, () => openHit(hit, mode));
  }
}

async function explainPair(ev) {
  ev.preventDefault();
  hideError();
  const box = $("pair-explanation");
  try {
    const e = await api("/api/explain-pair", { query: $("pair-query").value, passage: $("passage").value });
    renderExplanation(box, e, { title: "Why this passage scores what it scores", subtitle: `for “${e.query.text}”` });
  } catch (err) {
    box.hidden = true;
    failed(err, () => explainPair(new Event("submit")));
  }
}

function showTab(name) {
  for (const b of document.querySelectorAll(".tabs button")) b.classList.toggle("active", b.dataset.tab === name);
  for (const s of document.querySelectorAll("main > .tab")) s.hidden = s.id !== `tab-${name}`;
  if (name === "evals") loadEvals($("eval-files"), $("eval-charts"), showError);
}

function init() {
  for (const b of document.querySelectorAll(".tabs button")) b.addEventListener("click", () => showTab(b.dataset.tab));
  $("search-form").addEventListener("submit", search);
  // The time a search takes on the page is counted from the Enter key press itself.
  $("query").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") state.enterAt = ev.timeStamp;
  });
  $("collection").addEventListener("change", () => {
    collectionInfo(state.collections.find((c) => c.name === $("collection").value));
  });
  $("pair-form").addEventListener("submit", explainPair);
  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    setKey($("key").value.trim());
    $("key-form").hidden = true;
    hideError();
    loadInfo();
    if (state.retry) state.retry();
  });
  loadInfo();
  loadCollections();
}

init();
