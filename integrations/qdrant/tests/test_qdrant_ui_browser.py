"""`bgem3-qdrant ui` in a real browser: Debian's headless chromium driven by Selenium through chromedriver.

One browser for the module. On a tiny checkpoint and a small collection: the hits of every mode are those
`bgem3-qdrant search --json --mode M` prints, in its order; an opened hit shows the sparse terms and
ColBERT best matches `explain` computes, and a heatmap of query x passage cells; an eval JSON draws one
bar per mode and collection; documents holding HTML and script are shown as text and run nothing; bad
input is a message and the page keeps working; no request goes to another host. The screenshots of
docs/explain.md are taken here: set BGEM3_UI_SCREENSHOTS=docs/images to write them there.

With CI=true a browser that cannot start fails these tests; elsewhere they are skipped.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi", reason="the page's server needs the serve extra")

from bgem3_qdrant.cli import app  # noqa: E402
from bgem3_qdrant.errors import BGEM3QdrantError  # noqa: E402
from bgem3_qdrant.evaluation import EVAL_MODES  # noqa: E402
from ui_support import (  # noqa: E402
    COLLECTION,
    OTHER,
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
    message = f"no browser for the page tests: {reason}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: .ci/run installs chromium and chromium-driver)", pytrace=False)
    pytest.skip(message)


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
        hits[mode] = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
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
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(condition)


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
        if value:
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
    one(driver, ".eval-file[data-name='scifact.json']").click()
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
