"""`bgem3-qdrant ui` in a real browser: Debian's headless chromium driven by Selenium through chromedriver.

One browser for the module. On a tiny checkpoint and a small collection: the hits of every mode are those
`bgem3-qdrant search --json --mode M` prints, in its order; an opened hit shows the sparse terms and
ColBERT best matches `explain` computes, and a heatmap of query x passage cells; an eval JSON draws one
bar per mode and collection; documents holding HTML and script are shown as text and run nothing; bad
input is a message and the page keeps working; no request goes to another host; every highlight, heatmap
label and cut lands on the characters its code-point span names, after emoji, CJK Extension B ideographs,
mathematical letters and combining marks; a pooled or IDF collection says where its scores differ from an
explanation's. The screenshots of docs/explain.md are taken here: set BGEM3_UI_SCREENSHOTS=docs/images to
write them there.

With CI=true a browser that cannot start fails these tests; elsewhere they are skipped.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.optional import require_module, skip_or_fail

require_module("fastapi", reason="the page's server needs the serve extra")

from bgem3_qdrant.cli import app  # noqa: E402
from bgem3_qdrant.errors import BGEM3QdrantError  # noqa: E402
from bgem3_qdrant.evaluation import EVAL_MODES  # noqa: E402
from ui_support import (  # noqa: E402
    COLLECTION,
    EVAL_FILE,
    IDF,
    OTHER,
    POOLED,
    SYNTHETIC,
    UNICODE,
    UNICODE_TEXTS,
    XSS_IMG,
    XSS_SCRIPT,
    build_store,
    eval_report,
    served,
    session_for,
    write_eval_dir,
)

from bgem3_embeddings.cli_support import run_cli  # noqa: E402

QUERY = "sourdough starter flour"
LIMIT = 10
MODES = ("dense", "sparse", "hybrid", "rerank")
FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps",
    "--window-size=1440,1000",
]  # fmt: skip
WAIT_S = 60
# A pair the tiny random checkpoint finds shared sparse terms in (its sparse weights are mostly zero).
PAIR_QUERY = "How does ColBERT rerank candidates?"
PAIR_PASSAGE = "Hybrid search mixes dense meaning with sparse exact words like product codes XJ-900."


def _no_browser(reason: str) -> None:
    skip_or_fail(f"no browser for the page tests: {reason}", ".ci/run installs chromium and chromium-driver")


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless chromium with a new empty profile, logging every network event and console line."""
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        _no_browser(f"selenium is not installed ({e}); it is in the dev extra")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if not chromium or not chromedriver:
        _no_browser("chromium or chromedriver is not on PATH: apt-get install -y chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    try:
        browser = webdriver.Chrome(options=options, service=Service(str(chromedriver)))
    except WebDriverException as e:
        _no_browser(f"chromium did not start: {str(e).splitlines()[0]}")
    browser.set_script_timeout(WAIT_S)
    browser.get("about:blank")
    browser.get_log("performance")  # the browser's own start-up page (chrome://), before any test
    yield browser
    browser.quit()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, long_corpus: Path, encoder: Any) -> Path:
    return build_store(tmp_path_factory.mktemp("ui_browser"), long_corpus, encoder)[0]


@pytest.fixture(scope="module")
def cli_hits(store: Path, tiny_checkpoint: Path) -> dict[str, list[dict[str, Any]]]:
    """`bgem3-qdrant search QUERY --json --mode M -k 10` per mode, run before the page opens the store."""
    hits = {}
    for mode in MODES:
        out = io.StringIO()
        args = ["search", QUERY, "-c", COLLECTION, "--mode", mode, "-k", str(LIMIT), "--json",
                "--path", str(store), "--model", str(tiny_checkpoint)]  # fmt: skip
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
            run_cli(app, expected=(BGEM3QdrantError,), argv=args, start_tensorflow=False)
        assert done.value.code in (0, None), out.getvalue()
        (line,) = [line for line in out.getvalue().splitlines() if line.startswith("{")]  # one query
        hits[mode] = json.loads(line)["hits"]
    assert hits["dense"] and hits["rerank"] and hits["sparse"]  # the comparisons below compare something
    return hits


@pytest.fixture(scope="module")
def base_url(
    store: Path, cli_hits: dict[str, Any], encoder: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    session = session_for(store, encoder)
    try:
        with served(session, write_eval_dir(tmp_path_factory.mktemp("evals"))) as url:
            yield url
    finally:
        session.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = os.environ.get("BGEM3_UI_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Screenshots that are not docs/explain.md's: into BGEM3_UI_CHECKS when set (to look at them), else a
    temporary folder."""
    folder = os.environ.get("BGEM3_UI_CHECKS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("checks")
    path.mkdir(parents=True, exist_ok=True)
    return path


def shoot(driver: Any, element: Any, shot: Path) -> None:
    """A PNG of `element` whole: the window is made tall enough for it, then set back."""
    height, frame = driver.execute_script(
        "return [document.documentElement.scrollHeight, window.outerHeight - window.innerHeight]"
    )
    driver.set_window_size(1440, max(1000, int(height) + int(frame) + 40))
    try:
        png = element.screenshot_as_png
    finally:
        driver.set_window_size(1440, 1000)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, "not a screenshot"
    shot.write_bytes(png)


# -- page helpers
def wait(driver: Any, condition: Any) -> Any:
    """Poll ``condition`` until it holds; an element the page re-rendered between finding it and reading it
    (StaleElementReferenceException) counts as "not yet", as the page replaces lists it refreshes."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    stale = (StaleElementReferenceException,)
    return WebDriverWait(driver, WAIT_S, ignored_exceptions=stale).until(condition)


def css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def one(driver: Any, selector: str) -> Any:
    found = css(driver, selector)
    assert found, f"nothing matches {selector}"
    return found[0]


def open_page(driver: Any, url: str) -> None:
    driver.get(url)
    wait(driver, lambda d: one(d, "#collection").get_attribute("value") == COLLECTION)


def banner(driver: Any) -> str:
    """The error banner's text once it shows."""
    wait(driver, lambda d: one(d, "#banner").is_displayed())
    return str(one(driver, "#banner .banner-text").text)


def search(driver: Any, query: str, flt: str = "", ok: bool = True) -> None:
    """Type the query (and filter) and press Enter; `ok`: wait for the hits to be drawn."""
    from selenium.webdriver.common.keys import Keys

    driver.execute_script("document.getElementById('results').removeAttribute('data-query')")
    for selector, value in (("#filter", flt), ("#query", query)):
        box = one(driver, selector)
        box.clear()
        if value and max(map(ord, value)) > 0xFFFF:  # chromedriver types only characters of the BMP
            driver.execute_script("arguments[0].value = arguments[1]", box, value)
        elif value:
            box.send_keys(value)
    one(driver, "#query").send_keys(Keys.ENTER)
    if ok:
        wait(driver, lambda d: one(d, "#results").get_attribute("data-query") == query)


def column_ids(driver: Any, mode: str) -> list[str]:
    return [card.get_attribute("data-id") for card in css(driver, f".mode-{mode} .hit")]


def js(driver: Any, script: str) -> Any:
    return driver.execute_script(script)


# -- the tests
def test_each_mode_draws_the_hits_search_json_gives(
    driver: Any, base_url: str, cli_hits: dict[str, list[dict[str, Any]]], shots: Path
) -> None:
    open_page(driver, base_url)
    facts = one(driver, "#collection-info").text
    for fact in ("chunks", "model", "precision float32", "ColBERT unpooled", "ColBERT storage float16"):
        assert fact in facts, facts
    search(driver, QUERY)
    for mode in MODES:
        want = cli_hits[mode]
        assert column_ids(driver, mode) == [h["id"] for h in want], mode
        scores = [s.text for s in css(driver, f".mode-{mode} .hit .score")]
        assert scores == [f"{h['score']:.4f}" for h in want], mode
    # Where the same chunk ranks in each mode: every badge says the chunk's rank in that mode (or –).
    ranks = {m: {h["id"]: i for i, h in enumerate(cli_hits[m], start=1)} for m in MODES}
    for card in css(driver, ".hit"):
        badges = {b.get_attribute("data-mode"): b.text.split()[-1] for b in card.find_elements("css selector",
                                                                                              ".rank-badge")}
        assert badges == {m: str(ranks[m].get(card.get_attribute("data-id"), "–")) for m in MODES}
    # The sparse hits' matched terms are highlighted (amber marks inside their text).
    sparse_marks = css(driver, ".mode-sparse .hit .text mark.term")
    assert sparse_marks and all(m.get_attribute("data-token-id") for m in sparse_marks)
    assert float(one(driver, "#results").get_attribute("data-client-ms")) > 0
    assert "search" in one(driver, "#search-status").text
    shoot(driver, one(driver, "body"), shots / "explain-search.png")


def test_an_opened_hit_shows_the_terms_and_matches_explain_finds(
    driver: Any, base_url: str, cli_hits: dict[str, list[dict[str, Any]]], encoder: Any, shots: Path
) -> None:
    open_page(driver, base_url)
    search(driver, QUERY)
    # The first sparse hit: it shares terms with the query, so every part of the explanation has content.
    card = one(driver, ".mode-sparse .hit")
    text = {h["id"]: h["text"] for h in cli_hits["sparse"]}[card.get_attribute("data-id")]
    card.click()
    wait(driver, lambda d: css(d, "#explanation .heatmap"))
    want = encoder.explain(QUERY, text, colbert_matrix=True)
    terms = [int(r.get_attribute("data-token-id")) for r in css(driver, "#explanation .term-row")]
    assert terms and terms == [t.token_id for t in want.sparse_terms]
    matches = [(int(r.get_attribute("data-q")), int(r.get_attribute("data-p")))
               for r in css(driver, "#explanation tr.match")]  # fmt: skip
    assert matches == [(m.query_token, m.passage_token) for m in want.colbert_matches]
    marked = {(int(r.get_attribute("data-q")), int(r.get_attribute("data-p")))
              for r in css(driver, "#explanation .best-mark")}  # fmt: skip
    assert marked == set(matches)
    rows, cols = want.colbert_matrix.shape
    heat = one(driver, "#explanation svg.heatmap")
    assert (heat.get_attribute("data-rows"), heat.get_attribute("data-cols")) == (str(rows), str(cols))
    assert len(css(driver, "#explanation svg.heatmap rect.cell")) == rows * cols
    assert len(css(driver, "#explanation .q-label")) == rows
    assert len(css(driver, "#explanation .p-label")) == cols
    assert one(driver, "#explanation td.total").text == f"{want.combined:.4f}"
    tokens = want.passage.tokens
    aligned = {m.passage_token for m in want.colbert_matches  # tokens with characters (not <s>, </s>)
               if tokens[m.passage_token].stop > tokens[m.passage_token].start}  # fmt: skip
    marks = css(driver, "#explanation .passage mark.aligned")
    assert {int(p) for m in marks for p in m.get_attribute("data-p").split()} == aligned
    assert one(driver, "#explanation .passage").text.replace("\n", " ").split() == text.split()
    shoot(driver, one(driver, "#explanation"), shots / "explain-hit.png")


def test_documents_holding_html_are_shown_as_text_and_run_nothing(driver: Any, base_url: str) -> None:
    open_page(driver, base_url)
    search(driver, "flour notes", flt="lang=xss")
    texts = [t.text for t in css(driver, ".mode-dense .hit .text")]  # chunks of the two documents
    assert texts and all(t in XSS_SCRIPT or t in XSS_IMG for t in texts), texts
    joined = " ".join(texts)
    for literal in ("<script>", "</script>", "<img src=x", 'onerror="window.__xss'):
        assert literal in joined
    card = next(c for c in css(driver, ".mode-dense .hit") if "<" in c.text)
    chunk = card.find_element("css selector", ".text").text
    card.click()
    wait(driver, lambda d: css(d, "#explanation .passage mark"))
    assert one(driver, "#explanation .passage").text == chunk
    one(driver, ".tabs [data-tab=pair]").click()
    one(driver, "#pair-query").send_keys("<b>bold?</b>")
    one(driver, "#passage").send_keys(XSS_IMG)
    one(driver, "#pair-form button").click()
    wait(driver, lambda d: css(d, "#pair-explanation .passage mark"))
    assert one(driver, "#pair-explanation .passage").text == XSS_IMG
    assert "<b>bold?</b>" in one(driver, "#pair-explanation .muted").text
    assert js(driver, "return window.__xss === undefined")
    assert js(driver, "return document.querySelectorAll('main img, main script, main b').length") == 0


def test_an_eval_json_draws_one_bar_per_mode_and_collection(driver: Any, base_url: str, shots: Path) -> None:
    open_page(driver, base_url)
    one(driver, ".tabs [data-tab=evals]").click()
    wait(driver, lambda d: len(css(d, "#eval-files .eval-file")) == 3)
    assert [b.get_attribute("data-name") for b in css(driver, "#eval-files .eval-file.bad")] == [
        "broken.json", "notes.json"]  # fmt: skip
    one(driver, ".eval-file.bad").click()
    assert "broken.json: not valid JSON" in banner(driver)
    one(driver, f".eval-file[data-name='{EVAL_FILE}']").click()
    wait(driver, lambda d: len(css(d, "#eval-charts figure.chart")) == 4)
    report = eval_report()
    figures = {report["collection"]: report["modes"]}
    figures.update({name: c["modes"] for name, c in report["compare"].items()})
    for measure in ("ndcg@10", "recall@100", "mrr@10"):
        bars = css(driver, f"#eval-charts figure[data-measure='{measure}'] rect.bar-rect")
        drawn = {(b.get_attribute("data-mode"), b.get_attribute("data-collection")):
                 float(b.get_attribute("data-value")) for b in bars}  # fmt: skip
        assert len(bars) == len(EVAL_MODES) * len(figures) == len(drawn)
        assert drawn == {(m, c): figures[c][m][measure] for c in figures for m in EVAL_MODES}
    sizes = css(driver, "#eval-charts figure[data-measure='bytes_per_chunk'] .hbar-row")
    assert [s.get_attribute("data-collection") for s in sizes] == list(figures)
    assert "KiB" in sizes[0].text
    # The figures are made up (a formula in ui_support): the chart says so, naming no real model or data set.
    head = one(driver, "#eval-charts .report-head").text
    assert SYNTHETIC in head and "made-up figures" in head and "BAAI" not in head
    shoot(driver, one(driver, "#tab-evals"), shots / "explain-eval.png")


def test_bad_input_is_a_message_and_the_page_keeps_working(driver: Any, base_url: str, shots: Path) -> None:
    from selenium.webdriver.support.ui import Select

    open_page(driver, base_url)
    search(driver, "   ", ok=False)
    assert "the query is empty" in banner(driver)
    Select(one(driver, "#collection")).select_by_value(OTHER)
    assert "another model" in one(driver, "#collection-info .warn").text
    search(driver, QUERY, ok=False)
    assert "another model" in banner(driver) and "BAAI/some-other-model" in banner(driver)
    search(driver, "rye", flt="lang", ok=False)
    assert "not key=value" in banner(driver)
    Select(one(driver, "#collection")).select_by_value(COLLECTION)
    search(driver, QUERY)
    assert not one(driver, "#banner").is_displayed() and column_ids(driver, "rerank")
    one(driver, ".tabs [data-tab=pair]").click()
    one(driver, "#pair-query").send_keys(PAIR_QUERY)
    js(driver, "document.getElementById('passage').value = 'x'.repeat(8001)")
    one(driver, "#pair-form button").click()
    assert "over the page's limit" in banner(driver)
    js(driver, "document.getElementById('passage').value = ''")
    one(driver, "#pair-form button").click()
    wait(driver, lambda d: "the passage is empty" in banner(d))
    one(driver, "#passage").send_keys(PAIR_PASSAGE)
    one(driver, "#pair-form button").click()
    wait(driver, lambda d: css(d, "#pair-explanation .heatmap"))
    assert css(driver, "#pair-explanation .term-row")
    shoot(driver, one(driver, "#tab-pair"), shots / "explain-pair.png")


def test_no_request_leaves_the_machine(driver: Any, base_url: str) -> None:
    """Every request the browser made in this module (page, scripts, API, icon) went to the page's own
    server; the page runs under its Content-Security-Policy without a violation."""
    open_page(driver, base_url)
    search(driver, QUERY)
    one(driver, ".mode-dense .hit").click()
    wait(driver, lambda d: css(d, "#explanation .heatmap"))
    urls, documents = [], []
    for entry in driver.get_log("performance"):
        event = json.loads(entry["message"])["message"]
        if event["method"] == "Network.requestWillBeSent":
            urls.append(event["params"]["request"]["url"])
        elif event["method"] == "Network.responseReceived" and event["params"]["type"] == "Document":
            documents.append({k.lower(): v for k, v in event["params"]["response"]["headers"].items()})
    own = urlsplit(base_url).netloc
    assert any(u.startswith(base_url + "/api/search") for u in urls) and any(u.endswith(".js") for u in urls)
    elsewhere = [u for u in urls if urlsplit(u).scheme not in ("data", "about") and urlsplit(u).netloc != own]
    assert not elsewhere
    assert documents and all("default-src 'none'" in h["content-security-policy"] for h in documents)
    console = [e["message"] for e in driver.get_log("browser")]
    assert not [m for m in console if "Content Security Policy" in m or "Uncaught" in m], console


# -- offsets: the API's spans count code points, the page's strings UTF-16 units
ZWJ = "\u200d"
# [data key, textContent] of every element matching arguments[0], in document order.
MARKS_JS = """return Array.from(document.querySelectorAll(arguments[0]),
  (m) => [m.dataset.tokenId || m.dataset.p || "", m.textContent]);"""


def _inside(text: str, i: int) -> bool:
    """Whether a cut before text[i] would split a character as a reader sees it: a letter and its combining
    marks, an emoji ZWJ sequence (enough for UNICODE_TEXTS; the page asks Intl.Segmenter)."""
    if not 0 < i < len(text):
        return False
    return unicodedata.category(text[i]) in ("Mn", "Me") or ZWJ in (text[i], text[i - 1])


def widened(text: str, start: int, stop: int) -> tuple[int, int]:
    """A code-point span widened to whole characters."""
    while _inside(text, start):
        start -= 1
    while _inside(text, stop):
        stop += 1
    return start, stop


def shown(text: str, start: int, stop: int) -> str:
    """What a mark over text[start:stop] (code points) shows: whole characters."""
    a, b = widened(text, start, stop)
    return text[a:b]


def expected_marks(text: str, spans: list[tuple[str, int, int]]) -> list[tuple[str, str]]:
    """[(key, characters)] of the marks a list of (key, start, stop) spans draws: whole characters, in text
    order, a span overlapping an earlier one left out."""
    drawn, at = [], 0
    for key, a, b in sorted(((k, *widened(text, a, b)) for k, a, b in spans if b > a), key=lambda s: s[1]):
        if a >= at:
            drawn.append((key, text[a:b]))
            at = b
    return drawn


def term_spans(terms: Any) -> list[tuple[str, int, int]]:
    return [(str(t.token_id), a, b) for t in terms for a, b in t.passage_spans]


def token_label(text: str, token: Any) -> str:
    """A heatmap label: the token's characters (its piece for <s>, </s> and a lone "▁"), spaces collapsed."""
    own = token.stop <= token.start or token.piece == "▁"
    s = token.piece if own else shown(text, token.start, token.stop)
    return " ".join(s.split()) or "␣"


def check_explanation(driver: Any, box: str, query: str, passage: str, encoder: Any) -> list[str]:
    """The explanation in `box` puts each aligned-token mark, sparse mark and heatmap label on the characters
    its code-point span names. Returns the aligned marks' texts."""
    want = encoder.explain(query, passage, colbert_matrix=True)
    assert js(driver, f"return document.querySelector('{box} .passage').textContent") == passage
    tokens = want.passage.tokens
    aligned = js(driver, MARKS_JS.replace("arguments[0]", f"'{box} .passage mark.aligned'"))
    assert aligned
    for p_indices, text in aligned:
        spans = [tokens[int(i)] for i in p_indices.split()]
        start, stop = min(t.start for t in spans), max(t.stop for t in spans)
        assert text == shown(passage, start, stop), (p_indices, text)
    marked = {int(i) for p_indices, _ in aligned for i in p_indices.split()}
    assert marked == {m.passage_token for m in want.colbert_matches if tokens[m.passage_token].stop > tokens[
        m.passage_token].start}  # fmt: skip
    one(driver, f"{box} .toggle[data-view=sparse]").click()
    sparse = [tuple(m) for m in js(driver, MARKS_JS.replace("arguments[0]", f"'{box} .passage mark.term'"))]
    assert sparse == expected_marks(passage, term_spans(want.sparse_terms))
    one(driver, f"{box} .toggle[data-view=colbert]").click()
    labels = js(driver, f"""return ['q-label', 'p-label'].map((c) => Array.from(
        document.querySelectorAll('{box} svg.heatmap .' + c), (t) => t.textContent));""")
    rows, cols = want.colbert_matrix.shape
    q_want = [token_label(query, want.query.tokens[i + 1]) for i in range(rows)]
    p_want = [token_label(passage, tokens[j + 1]) for j in range(cols)]
    assert max(map(len, q_want + p_want)) <= 11  # under the page's label length: no "…" cut to predict
    assert labels == [q_want, p_want]
    assert "\ufffd" not in js(driver, f"return document.querySelector('{box}').textContent")
    return [text for _, text in aligned]


def test_marks_land_on_the_characters_after_emoji_cjk_math_letters_and_combining_marks(
    driver: Any, base_url: str, encoder: Any, checks: Path
) -> None:
    """Each text searched with itself as the query (so it shares sparse terms with itself): every card's
    marks are its terms' characters and its text is whole; the opened hit's aligned marks, sparse marks and
    heatmap labels are their tokens' characters; a mark never parts a combining mark from its letter."""
    from selenium.webdriver.support.ui import Select

    open_page(driver, base_url)
    Select(one(driver, "#collection")).select_by_value(UNICODE)
    seen_marks, aligned_texts = 0, []
    for key, text in UNICODE_TEXTS.items():
        search(driver, text)
        cards = js(driver, """return Array.from(document.querySelectorAll('.hit'), (c) => [c.dataset.mode,
            c.dataset.id, c.querySelector('.text').textContent, Array.from(c.querySelectorAll('.text mark'),
            (m) => [m.dataset.tokenId, m.textContent])]);""")
        own = [c for c in cards if c[2] == text]
        assert own and {c[0] for c in own} >= {"dense", "sparse"}, key
        for _mode, _id, card_text, marks in cards:
            assert card_text in UNICODE_TEXTS.values(), card_text  # whole: no half emoji, nothing lost
            want = encoder.explain(text, card_text, colbert_matrix=False).sparse_terms[:24]
            assert [tuple(m) for m in marks] == expected_marks(card_text, term_spans(want)), (key, card_text)
            seen_marks += len(marks)
        assert [c for c in own if c[3]], f"{key}: no term of the text is highlighted in its own card"
        # Its hit opened: the explanation's marks and labels.
        hit_id = own[0][1]
        one(driver, f".mode-sparse .hit[data-id='{hit_id}']").click()
        wait(driver, lambda d, i=hit_id: one(d, "#explanation").get_attribute("data-id") == i
             and css(d, "#explanation .heatmap"))  # fmt: skip
        aligned_texts += check_explanation(driver, "#explanation", text, text, encoder)
        if key == "emoji":
            shoot(driver, one(driver, "#explanation"), checks / "unicode-hit.png")
    assert seen_marks >= 20
    # Combining marks stay on their letter: "è" (e + U+0300) is one mark, though the token's span is the "e".
    assert any(unicodedata.category(c) == "Mn" for t in aligned_texts for c in t)
    assert "🐶🐕\u200d🦺" in aligned_texts and "𝔫𝔦" in aligned_texts and "𠀋𠮷" in aligned_texts


def test_explain_a_pair_marks_and_labels_with_emoji_and_combining_marks(
    driver: Any, base_url: str, encoder: Any, checks: Path
) -> None:
    # A query sharing a sparse term (six places, all after the emoji and ideographs) with the passage.
    query = "🐕 𝔘𝔫𝔦 record id file line number; cafe\u0301 espresso crema"
    passage = "🐕🐕 𠀋𠮷 " + UNICODE_TEXTS["math"] + " " + UNICODE_TEXTS["combining"]
    open_page(driver, base_url)
    one(driver, ".tabs [data-tab=pair]").click()
    for box, text in (("#pair-query", query), ("#passage", passage)):  # chromedriver types the BMP only
        driver.execute_script("arguments[0].value = arguments[1]", one(driver, box), text)
    one(driver, "#pair-form button").click()
    wait(driver, lambda d: css(d, "#pair-explanation .heatmap"))
    assert query in one(driver, "#pair-explanation .muted").text
    check_explanation(driver, "#pair-explanation", query, passage, encoder)
    one(driver, "#pair-explanation .toggle[data-view=sparse]").click()
    assert len(css(driver, "#pair-explanation .passage mark.term")) == 6
    assert not css(driver, "#pair-explanation .caveat")  # no collection, no search score beside it
    shoot(driver, one(driver, "#tab-pair"), checks / "unicode-pair.png")


def test_a_pooled_or_idf_collection_says_where_search_and_explanation_scores_differ(
    driver: Any, base_url: str, checks: Path
) -> None:
    """Rerank scores of a pooled collection come from pooled rows, an IDF collection's sparse scores are
    IDF-weighted; an explanation's are neither. The page says so beside both, and only then."""
    from selenium.webdriver.support.ui import Select

    query = UNICODE_TEXTS["ascii"]
    cases = {UNICODE: set(), POOLED: {"pooling"}, IDF: {"idf"}}
    open_page(driver, base_url)
    for name, notes in cases.items():
        Select(one(driver, "#collection")).select_by_value(name)
        facts = one(driver, "#collection-info").text
        assert ("IDF-weighted by Qdrant" in facts) == (name == IDF), facts
        assert ("ColBERT pooled by 2" in facts) == (name == POOLED), facts
        search(driver, query)
        columns = {c.get_attribute("data-caveat"): c.find_element("xpath", "..").get_attribute("data-mode")
                   for c in css(driver, "#results .caveat")}  # fmt: skip
        where = {"pooling": "rerank", "idf": "sparse"}
        assert columns == {k: v for k, v in where.items() if k in notes}, name
        if notes:
            shoot(driver, one(driver, "#tab-search"), checks / f"{name}-search.png")
        for mode in ("rerank", "sparse"):
            one(driver, f".mode-{mode} .hit").click()
            wait(driver, lambda d: css(d, "#explanation .heatmap"))
            said = {c.get_attribute("data-caveat"): c.text for c in css(driver, "#explanation .caveat")}
            assert set(said) == notes, (name, mode, said)
            if "pooling" in said:
                assert "pooled by 2" in said["pooling"] and "full text" in said["pooling"]
            if "idf" in said:
                assert "IDF-weighted" in said["idf"] and "without IDF" in said["idf"]
        if name == POOLED:
            shoot(driver, one(driver, "#explanation"), checks / "pooled-hit.png")


def _code_points(text: str, unit: int) -> int | None:
    """The code point index of UTF-16 index `unit` of `text`; None inside a surrogate pair."""
    try:
        return len(text.encode("utf-16-le")[: 2 * unit].decode("utf-16-le"))
    except UnicodeDecodeError:
        return None


def test_cuts_and_labels_fall_between_characters(driver: Any, base_url: str) -> None:
    """A card's cut (420 UTF-16 units around its first mark) and a heatmap's shortened label, on texts of
    emoji, mathematical letters and combining marks where a cut at a fixed count of units would split a
    character: the page's own modules, run in the page."""
    open_page(driver, base_url)
    runs = ("🐕", "𝔘", "e\u0301")
    texts = [pad + run * 400 + " dog " + run * 400 for run in runs for pad in ("", "x", "xy")]
    cuts = driver.execute_async_script(
        """const [texts, done] = arguments;
        Promise.all([import("/static/js/dom.js"), import("/static/js/search.js")]).then(([dom, search]) => {
          done(texts.map((text) => {
            const offsets = new dom.TextOffsets(text);
            const at = Array.from(text).indexOf("d");  // code points, as the API's spans
            const s = search.snippet(offsets, dom.inUnits(offsets, [{ start: at, stop: at + 3 }]));
            const marked = s.ranges.map((r) => s.text.slice(r.start, r.stop));
            return { start: s.start, stop: s.stop, text: s.text, marked, label: dom.clip(s.text, 12) };
          }));
        }, (err) => done(String(err)));""",
        texts,
    )
    assert isinstance(cuts, list), cuts
    for text, cut in zip(texts, cuts, strict=True):
        start, stop = _code_points(text, cut["start"]), _code_points(text, cut["stop"])
        assert start is not None and stop is not None, (text[:3], cut)  # not inside a surrogate pair
        assert 0 < start < stop < len(text) and not _inside(text, start) and not _inside(text, stop)
        assert cut["text"] == text[start:stop] and cut["marked"] == ["dog"]
        label = cut["label"]  # 11 characters of the cut text and "…"
        assert label.endswith("…") and text[start : start + len(label) - 1] == label[:-1]
        assert not _inside(text, start + len(label) - 1), label
