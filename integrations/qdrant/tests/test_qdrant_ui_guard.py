"""`bgem3-qdrant ui` as a process against a page on another site: a forged Host (DNS rebinding) reads
nothing, a cross-site Origin or a text/plain POST runs nothing (4xx, one line); the page's own requests
still work; the page's files keep their media types when the operating system's table maps .js to
text/plain; the printed address answers at once (it listens before printing)."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.optional import require_module, skip_or_fail

require_module("fastapi", reason="the page's server needs the serve extra")

from bgem3_qdrant import Ingestor, open_store, resolve_target  # noqa: E402
from bgem3_qdrant.sources import Document  # noqa: E402
from bgem3_qdrant.ui.app import STATIC  # noqa: E402

from tests.command_server import started_command  # noqa: E402
from tests.support import assert_clean_failure, run_module, tiny_server  # noqa: E402

SECRET = "The vault code is rye-4711."
COLLECTION = "private"
# What a Windows registry that maps .js (and .css) to text/plain does to Python's mimetypes; then the CLI.
WINDOWS_LIKE = (
    "import mimetypes, runpy, sys; "
    "mimetypes.add_type('text/plain', '.js'); mimetypes.add_type('text/plain', '.css'); "
    "sys.argv = ['bgem3-qdrant', *sys.argv[1:]]; runpy.run_module('bgem3_qdrant', run_name='__main__')"
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, encoder: Any) -> Path:
    path = tmp_path_factory.mktemp("ui_guard") / "store"
    with open_store(resolve_target(path=str(path))) as s:
        Ingestor(s, COLLECTION, encoder).ingest_documents([Document("vault", "vault", SECRET)])
    return path


@pytest.fixture(scope="module")
def encoder_url(tiny_checkpoint: Path) -> Iterator[str]:
    with tiny_server(tiny_checkpoint) as url:
        yield url


@pytest.fixture(scope="module")
def page(store: Path, encoder_url: str) -> Iterator[str]:
    """The command with a Windows-like media-type table, started as a user starts it; its printed URL."""
    args = ["-c", WINDOWS_LIKE, "ui", "--path", str(store), "--encoder-url", encoder_url, "--port", "0"]
    with started_command(args, "stdout") as (proc, url, lines):
        yield url
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, "".join(lines)


def port_of(url: str) -> str:
    return url.rsplit(":", 1)[1]


def message(response: httpx.Response) -> str:
    text = response.json()["error"]["message"]
    assert isinstance(text, str) and text and "\n" not in text, text
    return text


SEARCH = {"collection": COLLECTION, "query": "vault code"}


def test_a_forged_host_reads_nothing(page: str) -> None:
    """What a DNS-rebinding page on attacker.example sends."""
    for host in ("attacker.example", f"attacker.example:{port_of(page)}"):
        headers = {"Host": host}
        for r in (
            httpx.get(page + "/api/collections", headers=headers),
            httpx.post(page + "/api/search", json=SEARCH, headers=headers, timeout=60),
            httpx.get(page + "/api/info", headers=headers),
        ):
            assert r.status_code == 403, r.text
            assert "--allowed-host NAME (or BGEM3_UI_ALLOWED_HOSTS)" in message(r)
            assert COLLECTION not in r.text and "vault" not in r.text
        shown = httpx.get(page + "/", headers=headers)  # the page itself: one line of text
        assert shown.status_code == 403 and shown.text.count("\n") == 1 and "--allowed-host" in shown.text


def test_this_machines_names_still_read_the_store(page: str) -> None:
    port = port_of(page)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
        r = httpx.get(page + "/api/collections", headers={"Host": host})
        assert r.status_code == 200 and COLLECTION in r.text, (host, r.text)
    # The stock client as a user uses it, by name.
    hits = httpx.post(f"http://localhost:{port}/api/search", json=SEARCH, timeout=60)
    assert hits.status_code == 200 and hits.json()["modes"]["dense"][0]["text"] == SECRET


def test_a_cross_site_post_runs_nothing(page: str) -> None:
    """A form or a text/plain fetch from another site (no CORS preflight), and a foreign Origin."""
    body = b'{"query": "vault code", "passage": "rye"}'
    for content_type in ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {}
        for path in ("/api/search", "/api/explain-pair"):
            r = httpx.post(page + path, content=body, headers=headers)
            assert r.status_code == 415, (path, content_type, r.text)
            assert "Content-Type: application/json" in message(r)
    pair = {"query": "vault code", "passage": "rye"}
    for origin in ("https://attacker.example", "null", f"http://localhost:{port_of(page)}"):
        for path, body in (("/api/search", SEARCH), ("/api/explain-pair", pair)):
            r = httpx.post(page + path, json=body, headers={"Origin": origin}, timeout=60)
            assert r.status_code == 403 and "cross-site request refused" in message(r), (path, origin, r.text)
            assert SECRET not in r.text and "colbert" not in r.text  # neither searched nor explained
    # What the page itself sends: its own origin, JSON.
    own = httpx.post(page + "/api/search", json=SEARCH, headers={"Origin": page}, timeout=60)
    assert own.status_code == 200, own.text
    own = httpx.post(page + "/api/explain-pair", json=pair, headers={"Origin": page}, timeout=60)
    assert own.status_code == 200 and "colbert" in own.json(), own.text


def test_the_pages_files_keep_their_media_types(page: str) -> None:
    """With .js and .css mapped to text/plain in the process's table, the modules still run (nosniff)."""
    assert httpx.get(page + "/").headers["content-type"] == "text/html; charset=utf-8"
    want = {
        ".js": "text/javascript; charset=utf-8",
        ".css": "text/css; charset=utf-8",
        ".svg": "image/svg+xml",
    }
    files = [p for p in STATIC.rglob("*") if p.is_file() and p.suffix != ".html"]
    assert {p.suffix for p in files} == set(want)
    for f in files:
        r = httpx.get(f"{page}/static/{f.relative_to(STATIC).as_posix()}")
        assert r.status_code == 200 and r.headers["content-type"] == want[f.suffix], (f.name, r.headers)


@pytest.fixture
def own_store(store: Path, tmp_path: Path) -> Path:
    """A copy of the store: the embedded store is one process's at a time, and `page` holds the first."""
    return Path(shutil.copytree(store, tmp_path / "store"))


def ui_args(store: Path, encoder_url: str, *more: str) -> list[str]:
    return [
        "-m",
        "bgem3_qdrant",
        "ui",
        "--path",
        str(store),
        "--encoder-url",
        encoder_url,
        "--port",
        "0",
        *more,
    ]


def test_names_the_user_adds_are_served(own_store: Path, encoder_url: str) -> None:
    """BGEM3_UI_ALLOWED_HOSTS (commas), then --allowed-host (which the variable does not add to)."""
    env = {"BGEM3_UI_ALLOWED_HOSTS": "env-box.lan, Other-Box.lan."}
    with started_command(ui_args(own_store, encoder_url), "stdout", env) as (_, url, _lines):
        for host in ("env-box.lan", f"other-box.lan:{port_of(url)}"):
            r = httpx.get(url + "/api/collections", headers={"Host": host})
            assert r.status_code == 200 and COLLECTION in r.text, (host, r.text)
        assert httpx.get(url + "/api/collections", headers={"Host": "third-box.lan"}).status_code == 403
    with started_command(
        ui_args(own_store, encoder_url, "--allowed-host", "cli-box.lan"), "stdout"
    ) as started:
        url = started[1]
        assert httpx.get(url + "/api/collections", headers={"Host": "cli-box.lan:80"}).status_code == 200
        assert httpx.get(url + "/api/collections", headers={"Host": "env-box.lan"}).status_code == 403


def test_with_a_key_the_host_is_not_checked(own_store: Path, encoder_url: str) -> None:
    """A proxy may use any name; a rebinding page does not know the key."""
    with started_command(ui_args(own_store, encoder_url, "--ui-api-key", "s3cret"), "stdout") as (_, url, _l):
        forged = {"Host": "proxy.example"}
        assert httpx.get(url + "/api/collections", headers=forged).status_code == 401
        keyed = {**forged, "Authorization": "Bearer s3cret"}
        assert httpx.get(url + "/api/collections", headers=keyed).status_code == 200
        text = httpx.post(url + "/api/search", content=b"{}", headers={**keyed, "Content-Type": "text/plain"})
        assert text.status_code == 415


def test_a_bad_allowed_host_is_one_line(store: Path) -> None:
    done = run_module("bgem3_qdrant", "ui", "--path", str(store), "--allowed-host", "box.lan:8765")
    assert_clean_failure(done, 1, "'box.lan:8765' is not a host name (--allowed-host)")


@pytest.fixture(scope="module")
def rebinding_browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless chromium (Debian's) whose resolver maps attacker.example to 127.0.0.1: a DNS-rebinding
    attack's second step, without a DNS server. With CI=true a browser that cannot start fails the test."""
    reason = None
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        reason = f"selenium is not installed ({e}); it is in the dev extra"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if reason is None and (not chromium or not chromedriver):
        reason = "chromium or chromedriver is not on PATH: apt-get install -y chromium chromium-driver"
    browser = None
    if reason is None:
        options = webdriver.ChromeOptions()
        options.binary_location = str(chromium)
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                     "--no-first-run", "--host-resolver-rules=MAP attacker.example 127.0.0.1",
                     f"--user-data-dir={tmp_path_factory.mktemp('chromium-rebinding')}"):  # fmt: skip
            options.add_argument(flag)
        try:
            browser = webdriver.Chrome(options=options, service=Service(str(chromedriver)))
        except WebDriverException as e:
            reason = f"chromium did not start: {str(e).splitlines()[0]}"
    if browser is None:
        skip_or_fail(f"no browser: {reason}", ".ci/run installs chromium")
    browser.set_script_timeout(60)
    yield browser
    browser.quit()


def test_a_rebound_page_in_the_browser_reads_nothing(rebinding_browser: Any, page: str) -> None:
    """attacker.example now resolves to 127.0.0.1: its page and its same-origin fetches are refused, while
    the page opened at its printed address still loads its modules and lists the collection."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = rebinding_browser
    rebound = f"http://attacker.example:{port_of(page)}"
    driver.get(rebound + "/")
    body = driver.find_element(By.TAG_NAME, "body").text
    assert "does not name this server" in body and "--allowed-host" in body, body
    fetched = driver.execute_async_script(
        """const done = arguments[arguments.length - 1];
        Promise.all(['/api/collections', '/api/info'].map((p) => fetch(p).then(async (r) => [r.status,
            await r.text()]))).then(done, (e) => done(String(e)));"""
    )
    assert [status for status, _ in fetched] == [403, 403], fetched
    assert all(COLLECTION not in text and "vault" not in text for _, text in fetched)
    driver.get(page + "/")  # the real page: its ES modules run (their media type) and read the store
    # The options are read in one script: the page replaces the list when it refreshes, so elements found
    # in one WebDriver call may be stale by the next.
    options = "return [...document.querySelectorAll('#collection option')].map((o) => o.value)"
    WebDriverWait(driver, 60).until(lambda d: COLLECTION in d.execute_script(options))
