"""The site's generated references (tools/docs_reference.py) say what the code says: every console script of
the core and the integrations is documented, every command and option of each app is on the CLI page as its
`--help` prints it, and every route of `bgem3 serve` is on the HTTP page, taken from an app built without a
model (in a process that must not start TensorFlow)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tomllib
import warnings

import typer

from tests.docs_blocks import ROOT
from tools import docs_reference


def console_scripts() -> set[str]:
    """The `[project.scripts]` names of the core's and every integration's pyproject.toml."""
    names: set[str] = set()
    for pyproject in [ROOT / "pyproject.toml", *sorted((ROOT / "integrations").glob("*/pyproject.toml"))]:
        names |= set(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"].get("scripts", {}))
    return names


def test_every_console_script_is_documented() -> None:
    assert {script for script, _, _ in docs_reference.CONSOLE_SCRIPTS} == console_scripts()


def test_cli_page_holds_every_command_and_option_as_help_prints_it() -> None:
    page = docs_reference.cli_page()
    for script, module, attribute in docs_reference.CONSOLE_SCRIPTS:
        root = typer.main.get_command(getattr(importlib.import_module(module), attribute))
        commands = list(docs_reference._walk(root, [script]))
        assert len(commands) > 5, script
        for words, command in commands:
            assert f"`{' '.join(words)}`" in page, words
            ctx = typer.Context(command, info_name=" ".join(words))
            for param in command.params:
                record = param.get_help_record(ctx)
                if record is None or param.name in docs_reference.TYPER_COMPLETION:
                    continue
                # the names as --help prints them, e.g. `-m, --model <str>`
                assert f"`{docs_reference._cell(record[0])}`" in page, (words, record[0])


def test_cli_page_shows_help_text_as_written() -> None:
    """Help text is shown, not read as markup: `<s>` stays visible and `[A][B]` is no link."""
    assert docs_reference._plain("a <s> b [x][y] `<s>`") == "a &lt;s&gt; b \\[x\\]\\[y\\] `<s>`"


def test_http_page_lists_every_route_without_a_model() -> None:
    """Every (method, path) of the schema is on the page; building it imports no TensorFlow, Keras, torch."""
    script = (
        "import json, sys\n"
        "from tools.docs_reference import http_page, openapi_schema\n"
        "page = http_page()\n"
        "routes = [(m.upper(), p) for p, ms in openapi_schema()['paths'].items() for m in ms]\n"
        "missing = [r for r in routes if f'`{r[0]} {r[1]}`' not in page]\n"
        "heavy = [m for m in ('tensorflow', 'keras', 'torch', 'jax') if m in sys.modules]\n"
        "print(json.dumps({'routes': len(routes), 'missing': missing, 'heavy': heavy}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["routes"] >= 17, result  # OpenAI, TEI, bgem3, rerank and operations routes
    assert result["missing"] == [], result
    assert result["heavy"] == [], result


def test_http_page_covers_the_app_routes() -> None:
    """The schema the page is made from has every route the app serves (none hidden from the schema)."""
    from fastapi.routing import APIRoute

    from bgem3_embeddings.serve.app import create_app
    from bgem3_embeddings.serve.settings import ServeSettings

    app = create_app(object(), ServeSettings(), reranker=object())
    served = {
        (method, route.path)
        for route in app.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }
    schema = docs_reference.openapi_schema()
    documented = {(m.upper(), p) for p, methods in schema["paths"].items() for m in methods}
    assert served - {("HEAD", path) for _, path in served} <= documented


def test_the_site_puts_the_generated_pages_in_place_of_the_placeholders() -> None:
    """docs/reference/cli.md and http-api.md are placeholders (so links to them resolve on GitHub) that say
    how to read the reference; the site's build serves the generated page at that path, and only it."""
    from mkdocs.config import load_config
    from mkdocs.structure.files import get_files

    config = load_config(str(ROOT / "mkdocs.yml"))
    with warnings.catch_warnings():
        # MkDocs still replaces a page appended over another one, with a DeprecationWarning: replace cleanly
        warnings.simplefilter("error", DeprecationWarning)
        files = config.plugins.on_files(get_files(config), config=config)  # mkdocs.yml's hooks, as a build
    for uri in docs_reference.GENERATED_PAGES:
        placeholder = (ROOT / "docs" / uri).read_text(encoding="utf-8")
        assert "make docs" in placeholder and "python -m tools.docs_reference" in placeholder, uri
        served = [f for f in files if f.src_uri == uri]
        assert len(served) == 1, uri
        assert served[0].content_string.startswith(docs_reference.GENERATED_NOTE), uri
