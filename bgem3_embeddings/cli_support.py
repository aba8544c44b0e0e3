"""What every command of the project shares: TensorFlow started quietly, one-line errors, `--debug`.

A person running a command sees one clear line for an expected failure (and a hint when it helps), never a
traceback or TensorFlow's C++ start-up lines; `--debug` (anywhere on the command line) or BGEM3_DEBUG=1
shows the traceback and the start-up lines again.

    app = typer.Typer()
    def main() -> None:
        run_cli(app, expected=(MyPackageError,))
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

# Re-exported: commands start TensorFlow through here (the module itself needs no typer).
from bgem3_embeddings.backends.tensorflow.quiet import TF_LOG_ENV, start_tensorflow_quietly
from bgem3_embeddings.serve.memory import LONG_RUN_MMAP_THRESHOLD, MAX_MMAP_THRESHOLD

if TYPE_CHECKING:
    from bgem3_embeddings.checkpoint.tiny import Kind

__all__ = [
    "CommandError",
    "check_inputs",
    "checkpoint_problem",
    "expected_errors",
    "fix_server_heap",
    "is_missing_extra",
    "load_encoder",
    "plain_help",
    "refuse_empty_texts",
    "require_modules",
    "run_cli",
    "start_tensorflow_quietly",
]

# Every long-running server's option (bgem3 serve, bgem3-qdrant mcp over HTTP, bgem3-qdrant ui);
# serve.memory.long_run_heap applies it and words the start-up line.
MallocMmapThresholdOpt = Annotated[
    int,
    typer.Option(
        "--malloc-mmap-threshold",
        min=0,
        max=MAX_MMAP_THRESHOLD,
        metavar="BYTES",
        help="glibc (Linux): blocks of this size or more get their own mapping, so memory stays flat over "
        "weeks (about 1% slower on passages; docs/serve-operations.md); 0: glibc's sliding default. "
        "MALLOC_MMAP_THRESHOLD_ wins.",
    ),
]
DEFAULT_MMAP_THRESHOLD = LONG_RUN_MMAP_THRESHOLD


def fix_server_heap(nbytes: int, command: str) -> None:
    """A server's --malloc-mmap-threshold applied before its model loads (the model's buffers are the large
    blocks), and the start-up line on stderr that says what it did."""
    from bgem3_embeddings.serve.memory import long_run_heap

    line = long_run_heap(nbytes, command)
    if line:
        typer.echo(line, err=True)

DEBUG_FLAG = "--debug"
DEBUG_ENV = "BGEM3_DEBUG"
HELP_FLAGS = ("--help", "-h")


class CommandError(Exception):
    """An expected failure whose message is shown as it is (the cause, and the fix when there is one)."""


def expected_errors() -> tuple[type[BaseException], ...]:
    """The core library's errors that mean "the user asked for something that cannot be done", or that a
    file they gave is broken (a truncated or damaged checkpoint, a bad config.json): each names the file."""
    # Modules that import neither TensorFlow nor torch: this runs before every command, `--help` included.
    from bgem3_embeddings.backends.keras_backend import BackendFeatureError
    from bgem3_embeddings.checkpoint.files import CheckpointNotFoundError
    from bgem3_embeddings.checkpoint.tensor_source import CheckpointFormatError
    from bgem3_embeddings.config import ConfigError

    return (CommandError, CheckpointNotFoundError, CheckpointFormatError, ConfigError, BackendFeatureError)


def load_encoder(model: str, precision: str = "auto", device: str = "auto", **kwargs: Any) -> Any:
    """Build the encoder, turning configuration errors into a clean CLI error."""
    start_tensorflow_quietly()  # as `bgem3_embeddings.BGEM3Encoder` does
    from bgem3_embeddings.encoder import BGEM3Encoder

    try:
        return BGEM3Encoder(model, precision=precision, device=device, **kwargs)
    except expected_errors():
        # A missing or broken checkpoint is a file problem, not a usage error: its message names the file
        # (and the fix), shown as it is by run_cli with exit 1.
        raise
    except (ValueError, FileNotFoundError, TypeError) as err:
        raise typer.BadParameter(str(err), param_hint="--model/--precision/--compute-dtype/--device") from err


def plain_help(command: Any) -> None:
    """click's own help layout for `command` and every command below it, whatever is registered.

    Typer's Rich panels cut option names and environment variables at 80 columns (`--no-colbert-on-d…`,
    `BGEM3_QDRANT_COLL…`) and show `<bool>` on every flag; click's layout wraps the help text instead and
    keeps every name whole. Usage lines name arguments as PATHS... / [TEXTS]... rather than `{paths}...`.
    """
    pending = [command]
    while pending:
        cmd = pending.pop()
        if hasattr(cmd, "rich_markup_mode"):
            cmd.rich_markup_mode = None
        for param in getattr(cmd, "params", ()):
            if getattr(param, "param_type_name", "") == "argument":
                param.metavar = str(param.metavar or param.name or "ARG").upper()
                param.get_usage_pieces = _usage_pieces(param)
        pending.extend(getattr(cmd, "commands", {}).values())


def _usage_pieces(param: Any) -> Any:
    """An argument's usage piece: NAME, NAME... (several), [NAME] (optional)."""
    name = str(param.metavar)
    if param.nargs != 1:
        name += "..."
    piece = name if param.required else f"[{name}]"
    return lambda ctx: [piece]


def checkpoint_problem(model: str, kind: Kind = "encoder") -> str | None:
    """Why `model` cannot be loaded, when it names a local folder (a missing folder, missing files); None
    for a usable folder or a hub id (fetched when it loads). Reads no weights and imports no TensorFlow.
    `tiny` (the tiny random model of `kind`) is generated here when missing, with a line on stderr."""
    from bgem3_embeddings.checkpoint.files import (
        CheckpointNotFoundError,
        checkpoint_files_in,
        local_checkpoint_path,
        looks_like_hub_id,
    )
    from bgem3_embeddings.checkpoint.tiny import TinyUnavailableError, ensure_tiny, is_tiny_name

    if is_tiny_name(model):
        try:
            ensure_tiny(kind, announce=lambda line: typer.echo(line, err=True))
        except TinyUnavailableError as err:
            return str(err)
    path = local_checkpoint_path(model, kind)
    if not path.exists() and looks_like_hub_id(model):
        return None
    try:
        files = checkpoint_files_in(path)
    except CheckpointNotFoundError as err:
        return str(err)
    return _wrong_kind(files.config, kind)


def _wrong_kind(config: Path, kind: Kind) -> str | None:
    """A cross-encoder given where an embedding model is expected (or the reverse), said with the option
    that takes it; None when config.json cannot tell (the loader names a broken file)."""
    import json

    try:
        architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return None
    is_reranker = "XLMRobertaForSequenceClassification" in architectures
    if kind == "encoder" and is_reranker:
        return (
            f"{config.parent} is a cross-encoder reranker, not an embedding model: pass it as --reranker "
            "(or to `bgem3 rerank --model`), and an embedding model such as BAAI/bge-m3 as --model"
        )
    return None


def check_inputs(
    model: str | None = None,
    paths: Sequence[str | Path] = (),
    paths_hint: str = "PATHS",
    kind: Kind = "encoder",
) -> None:
    """Every input path and the checkpoint (of `kind`) checked before anything loads; one CommandError
    naming all that is missing at once (a user fixes them in one go, not one per run)."""
    problems = []
    missing = [str(p) for p in paths if not Path(p).expanduser().exists()]
    if missing:
        problems.append(f"no such file or directory: {', '.join(missing)} ({paths_hint})")
    problem = checkpoint_problem(model, kind) if model is not None else None
    if problem:
        problems.append(f"{problem} (--model)")
    if problems:
        raise CommandError("; ".join(problems) + "; nothing was loaded")


def refuse_empty_texts(texts: Sequence[str], hint: str, what: str = "text") -> None:
    """The rule every text a user sends follows (query_text.is_blank): a usage line naming which text
    (`what N` among several) and the argument `hint`, before anything loads."""
    from bgem3_embeddings.query_text import empty_text, is_blank

    for i, text in enumerate(texts):
        if is_blank(text):
            name = f"{what} {i + 1}" if len(texts) > 1 else f"the {what}"
            raise typer.BadParameter(empty_text(name), param_hint=hint)


def require_modules(modules: Sequence[str], what: str, install: str) -> None:
    """A CommandError naming the pip command when any of `modules` is not installed (checked before
    anything loads): `what needs X, Y (the ... extra), not installed: run INSTALL`."""
    import importlib

    missing = []
    for module in modules:
        try:
            importlib.import_module(module)  # imported, not only found: a broken install counts as missing
        except ImportError:
            missing.append(module)
    if missing:
        raise CommandError(f"{what} needs {', '.join(missing)}, not installed: run {install}")


def is_missing_extra(err: BaseException) -> bool:
    """An optional dependency that is not installed, said with the command that installs it (an
    ImportError naming `pip install ...`): an expected condition, never a bug."""
    return isinstance(err, ImportError) and "pip install" in str(err)


def _strip_debug(argv: Sequence[str]) -> tuple[list[str], bool]:
    args = [a for a in argv if a != DEBUG_FLAG]
    return args, len(args) != len(argv) or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _one_line(text: str) -> str:
    """Collapse a message onto one line (exception texts may carry newlines or indented detail)."""
    return " ".join(text.split())


def _is_a(err: BaseException, class_name: str) -> bool:
    """Whether `err` is a click exception of that name: Typer >= 0.20 vendors its own copy of click."""
    return any(cls.__name__ == class_name for cls in type(err).__mro__)


def _click_failure(err: Any) -> NoReturn:
    """A usage error in one line plus where to look; a bare command group prints its help as click does."""
    if type(err).__name__ == "NoArgsIsHelpError":
        err.show()
        raise SystemExit(err.exit_code)
    ctx = getattr(err, "ctx", None)
    hint = f"see '{ctx.command_path} --help'" if ctx is not None and _is_a(err, "UsageError") else None
    _fail(_one_line(err.format_message()), hint, code=err.exit_code)


def _fail(message: str, hint: str | None = None, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    if hint:
        typer.echo(f"  {hint}", err=True)
    raise SystemExit(code)


def run_cli(
    app: typer.Typer,
    *,
    expected: tuple[type[BaseException], ...] = (),
    argv: Sequence[str] | None = None,
    prog_name: str | None = None,
    start_tensorflow: bool = True,
) -> NoReturn:
    """Run a Typer app as a command: exit codes, one-line errors, `--debug`, quiet TensorFlow start-up.

    expected: exception types whose message is meant for the user (shown as `error: <message>`, exit 1);
    the core's own (CheckpointNotFoundError, CommandError) are always expected, and so is a missing
    optional dependency whose ImportError names its `pip install` command. Anything else is a bug:
    `error: unexpected <Type>: <message>` and a hint to re-run with --debug, still without a traceback.
    """
    args, debug = _strip_debug(sys.argv[1:] if argv is None else argv)
    if debug:  # TensorFlow's start-up lines too: a level set here is one tensorflow/quiet.py leaves alone
        os.environ.setdefault(TF_LOG_ENV, "0")
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    wants_help = not args or any(a in HELP_FLAGS for a in args)
    if start_tensorflow and not debug and not wants_help:
        start_tensorflow_quietly()
    command = typer.main.get_command(app)
    plain_help(command)
    known = expected_errors() + tuple(expected)
    try:
        result: Any = command.main(args=args, prog_name=prog_name, standalone_mode=False)
    except KeyboardInterrupt:
        _fail("interrupted", code=130)
    except Exception as err:
        if _is_a(err, "ClickException"):  # bad arguments and options: click's own message
            _click_failure(err)
        if _is_a(err, "Abort"):
            _fail("aborted", code=130)
        if isinstance(err, known) or is_missing_extra(err):
            if debug:
                logging.getLogger(__name__).exception("expected failure (traceback shown for --debug)")
            _fail(_one_line(str(err)) or type(err).__name__)
        if debug:
            raise
        _fail(
            f"unexpected {type(err).__name__}: {_one_line(str(err))}",
            f"this is a bug; run again with {DEBUG_FLAG} for the traceback",
        )
    raise SystemExit(result if isinstance(result, int) else 0)
