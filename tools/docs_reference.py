"""The site's generated reference pages (a MkDocs hook: mkdocs.yml's `hooks:`), made at build time from the
code itself, so the help a command prints and the page cannot disagree:

- reference/cli.md: every command of every console script (`bgem3`, `bgem3-qdrant`), read from its Typer
  app's click objects (help text, arguments, options, defaults, environment variables);
- reference/http-api.md: every route of `bgem3 serve`, read from the FastAPI app's own OpenAPI schema. The
  app is built around placeholder models: building it loads nothing (the models are touched only when its
  lifespan starts), so no checkpoint, TensorFlow or network is needed.

In the repository those two files are placeholders that say how to read the reference (`--help`, `make docs`,
this module): the site's build puts the generated page in their place, and no copy is kept to fall behind.

    python -m tools.docs_reference cli|http     # print a page (what the hook adds to the site)
"""

from __future__ import annotations

import html
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The console scripts (pyproject.toml's [project.scripts] of the core and of each integration) and the
# Typer app behind each.
CONSOLE_SCRIPTS = (
    ("bgem3", "bgem3_embeddings.cli", "app"),
    ("bgem3-qdrant", "bgem3_qdrant.cli", "app"),
)
CLI_PAGE = "reference/cli.md"
HTTP_PAGE = "reference/http-api.md"
# The shell-completion options Typer adds to every app: not this project's.
TYPER_COMPLETION = ("install_completion", "show_completion")
GENERATED_NOTE = "<!-- generated at build time by tools/docs_reference.py: edit the code, not this page -->"


# ---------------------------------------------------------------------------------------------- the CLI
def _cell(text: object) -> str:
    """Text fit for one markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _plain(text: str) -> str:
    """Help text shown as written: outside `code`, `<s>` is not read as HTML nor `[A][B]` as a link."""
    pieces = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(pieces), 2):  # the even pieces are outside backticks
        escaped = html.escape(pieces[i], quote=False)
        pieces[i] = escaped.replace("[", "\\[").replace("]", "\\]").replace("*", "\\*").replace("_", "\\_")
    return "".join(pieces)


def _prose(text: str) -> str:
    """Help text as one table cell."""
    return _cell(_plain(text))


def _command_rows(command: Any, ctx: Any) -> list[str]:
    """The arguments and options of a command as a table: each row is the line `--help` prints for it
    (`get_help_record`: names, type, help, then its env var and default as `[...]`)."""
    rows = ["| argument / option | what |", "| --- | --- |"]
    for param in command.params:
        record = None if getattr(param, "hidden", False) else param.get_help_record(ctx)
        if record is None or param.name in TYPER_COMPLETION:
            continue
        names, what = record
        if param.param_type_name == "argument" and param.required:
            what = f"(required) {what}"
        rows.append(f"| `{_cell(names)}` | {_prose(what)} |")
    return rows if len(rows) > 2 else []


def _walk(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    """(words, command) for a command and each of its subcommands, depth first, in the app's order."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        if not getattr(sub, "hidden", False):
            yield from _walk(sub, [*path, name])


def _usage(command: Any, ctx: Any, words: list[str]) -> str:
    return " ".join([*words, *command.collect_usage_pieces(ctx)])


def cli_page() -> str:
    """reference/cli.md: every command of every console script, from the Typer apps themselves."""
    import importlib

    import typer

    out = [
        GENERATED_NOTE,
        "# Command-line reference",
        "",
        "Generated from the commands themselves when the site is built: this page is what `--help` prints,",
        "laid out as tables. The guides say when to use each command; `COMMAND --help` prints the same.",
        "",
    ]
    for script, module, attribute in CONSOLE_SCRIPTS:
        app = getattr(importlib.import_module(module), attribute)
        root = typer.main.get_command(app)
        for words, command in _walk(root, [script]):
            level = "##" if len(words) == 1 else "###"
            out += [f"{level} `{' '.join(words)}`", ""]
            if command.help:
                out += [_help_text(command.help), ""]
            ctx = typer.Context(command, info_name=" ".join(words))
            out += ["```", _usage(command, ctx, words), "```", ""]
            rows = _command_rows(command, ctx)
            if rows:
                out += [*rows, ""]
    return "\n".join(out)


def _help_text(text: str) -> str:
    """A command's docstring as markdown: click's `\\b` (keep this paragraph's lines) markers dropped."""
    return _plain("\n".join(line for line in text.strip().splitlines() if line.strip() != "\b"))


# ------------------------------------------------------------------------------------------ the HTTP API
def openapi_schema() -> dict[str, Any]:
    """`bgem3 serve`'s OpenAPI schema, from an app built around placeholder models (nothing is loaded)."""
    from bgem3_embeddings.serve.app import create_app
    from bgem3_embeddings.serve.settings import ServeSettings

    # create_app only stores its models; the lifespan (never started here) warms them up.
    app = create_app(object(), ServeSettings(model_name="BAAI/bge-m3"), reranker=object())
    return app.openapi()


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _schema_type(schema: dict[str, Any]) -> str:
    """A JSON schema's type in a few words, with links to the models it names."""
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return f"[{name}](#{name.lower()})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_schema_type(s) for s in schema[key])
    kind = schema.get("type")
    if kind == "array":
        return f"array of {_schema_type(schema.get('items', {}))}"
    if (
        kind == "object"
        and "additionalProperties" in schema
        and isinstance(schema["additionalProperties"], dict)
    ):
        return f"object of {_schema_type(schema['additionalProperties'])}"
    if "enum" in schema:
        return " or ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    return str(kind or "any")


def _model_section(name: str, schema: dict[str, Any]) -> list[str]:
    out = [f"### {name}", ""]
    if schema.get("description"):
        out += [schema["description"].strip(), ""]
    properties = schema.get("properties", {})
    if properties:
        required = set(schema.get("required", ()))
        out += ["| field | type | default | what |", "| --- | --- | --- | --- |"]
        for field, spec in properties.items():
            default = (
                "required"
                if field in required
                else (f"`{json.dumps(spec['default'])}`" if "default" in spec else "")
            )
            what = _cell(spec.get("description", ""))
            out.append(f"| `{field}` | {_cell(_schema_type(spec))} | {_cell(default)} | {what} |")
        out.append("")
    elif schema.get("enum"):
        out += ["One of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"]) + ".", ""]
    return out


def http_page() -> str:
    """reference/http-api.md: each route of `bgem3 serve` and each request model, from its OpenAPI schema."""
    schema = openapi_schema()
    info = schema.get("info", {})
    out = [
        GENERATED_NOTE,
        "# HTTP API reference (`bgem3 serve`)",
        "",
        f"Generated from the server's own OpenAPI schema ({info.get('title', '')} {info.get('version', '')},",
        f"OpenAPI {schema.get('openapi', '')}) when the site is built. What each route is for, with examples",
        "and errors: [the serving guide](../serve.md). A running server also serves this schema itself at",
        "`/openapi.json`, with FastAPI's pages at `/docs` and `/redoc`.",
        "",
        "## Routes",
        "",
        "| method | path | summary |",
        "| --- | --- | --- |",
    ]
    operations = []
    for path, methods in schema.get("paths", {}).items():
        for method, operation in methods.items():
            operations.append((path, method.upper(), operation))
            out.append(
                f"| `{method.upper()}` | [`{path}`](#{_operation_anchor(method, path)}) | "
                f"{_cell(operation.get('summary', ''))} |"
            )
    out.append("")
    for path, method, operation in operations:
        out += [f"### `{method} {path}` {{#{_operation_anchor(method, path)}}}", ""]
        if operation.get("description"):
            out += [operation["description"].strip(), ""]
        body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        if body:
            out += [f"Request body (JSON): {_schema_type(body)}.", ""]
        params = operation.get("parameters", [])
        if params:
            out += ["| parameter | in | type |", "| --- | --- | --- |"]
            out += [
                f"| `{p['name']}` | {p['in']} | {_cell(_schema_type(p.get('schema', {})))} |" for p in params
            ]
            out.append("")
        statuses = ", ".join(
            f"{code} ({_cell(resp.get('description', ''))})"
            for code, resp in operation.get("responses", {}).items()
        )
        out += [f"Responses: {statuses}.", ""]
    out += ["## Request and response models", ""]
    for name, model in schema.get("components", {}).get("schemas", {}).items():
        out += _model_section(name, model)
    return "\n".join(out)


def _operation_anchor(method: str, path: str) -> str:
    slug = "".join(c if c.isalnum() else "-" for c in path.strip("/")) or "root"
    return f"{method.lower()}-{slug}"


# --------------------------------------------------------------------------------------- the MkDocs hook
GENERATED_PAGES = {CLI_PAGE: cli_page, HTTP_PAGE: http_page}


def on_files(files: Any, config: Any) -> Any:
    """Put the generated pages in the site in place of their placeholders: docs/reference/cli.md and
    http-api.md hold only how to see the reference (what GitHub shows, so links to them resolve there)."""
    from mkdocs.structure.files import File

    for uri, render in GENERATED_PAGES.items():
        placeholder = files.get_file_from_path(uri)
        if placeholder is not None:
            files.remove(placeholder)
        files.append(File.generated(config, uri, content=render()))
    return files


def main(argv: list[str]) -> int:
    pages = {"cli": cli_page, "http": http_page}
    if len(argv) != 1 or argv[0] not in pages:
        sys.stderr.write("usage: python -m tools.docs_reference cli|http\n")
        return 2
    sys.stdout.write(pages[argv[0]]() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
