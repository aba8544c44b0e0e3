"""`bgem3 rerank QUERY PASSAGE...`: order passages by a cross-encoder's score for the query.

bgem3 rerank "what is a panda?" "hi" "The giant panda is a bear." --normalize
bgem3 rerank "what is a panda?" "hi" "The giant panda is a bear." --json --model ./bge-reranker-v2-m3
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from bgem3_embeddings.cli_options import DeviceOpt, PrecisionOpt
from bgem3_embeddings.cli_support import (
    CommandError,
    check_inputs,
    expected_errors,
    refuse_empty_texts,
    start_tensorflow_quietly,
)
from bgem3_embeddings.query_text import check_query
from bgem3_embeddings.reranker import DEFAULT_MAX_LENGTH, DEFAULT_RERANKER_ID
from bgem3_embeddings.reranker.pairs import PAIR_SPECIAL_TOKENS

RERANKER_MODEL_ENV = "BGEM3_RERANKER_MODEL"
PREVIEW_CHARS = 70  # of each passage in the plain output


def load_reranker(model: str, precision: str = "auto", device: str = "auto", **kwargs: Any) -> Any:
    """Build the reranker, a bad option becoming a clean CLI error (a broken checkpoint names its file)."""
    start_tensorflow_quietly()  # as `bgem3_embeddings.BGEM3Reranker` does
    from bgem3_embeddings.reranker.reranker import BGEM3Reranker

    try:
        return BGEM3Reranker(model, precision=precision, device=device, **kwargs)
    except expected_errors():
        raise
    except (ValueError, FileNotFoundError, TypeError) as err:
        raise typer.BadParameter(str(err), param_hint="--model/--precision/--device/--max-length") from err


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 3] + "..."


def rerank_command(
    query: Annotated[str, typer.Argument(help="The query.")],
    passages: Annotated[list[str], typer.Argument(help="The passages to order.")],
    model: Annotated[
        str,
        typer.Option(
            "--model", "-m", help="Reranker: hub id or local checkpoint folder.", envvar=RERANKER_MODEL_ENV
        ),
    ] = DEFAULT_RERANKER_ID,
    normalize: Annotated[
        bool, typer.Option("--normalize", help="Scores through a sigmoid, in (0, 1), instead of logits.")
    ] = False,
    top_n: Annotated[int | None, typer.Option("--top-n", min=1, help="Show only the best N.")] = None,
    max_length: Annotated[
        int,
        typer.Option(
            min=PAIR_SPECIAL_TOKENS, help="Tokens of a (query, passage) pair; the query keeps 3/4 at most."
        ),
    ] = DEFAULT_MAX_LENGTH,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print a JSON array of {index, score, text}, best first.")
    ] = False,
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
) -> None:
    """Score each passage against the query with a cross-encoder (bge-reranker-v2-m3) and list them best
    first."""
    try:
        check_query(query)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="QUERY") from err
    refuse_empty_texts(passages, "PASSAGES", "passage")
    check_inputs(model, kind="reranker")  # a missing local folder or file is named before anything loads
    reranker = load_reranker(model, precision, device, max_length=max_length, show_progress=False)
    try:
        ranked = reranker.rerank(query, passages, top_n=top_n, normalize=normalize)
    except (ValueError, TypeError) as err:
        raise CommandError(str(err)) from err
    if json_out:
        records = [{"index": i, "score": score, "text": passages[i]} for i, score in ranked]
        typer.echo(json.dumps(records, ensure_ascii=False))
        return
    typer.echo(f"{'rank':>4}  {'score':>10}  {'index':>5}  passage")
    for rank, (i, score) in enumerate(ranked, start=1):
        typer.echo(f"{rank:>4}  {score:>10.4f}  {i:>5}  {_preview(passages[i])}")
