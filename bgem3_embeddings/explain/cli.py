"""`bgem3 explain QUERY PASSAGE`: why a passage scores what it scores, per mode and per token (no store).

    bgem3 explain "What is BGE M3?" "BGE M3 is an embedding model ..." --model BAAI/bge-m3
    bgem3 explain "..." "..." --encoder-url http://127.0.0.1:8000 --json      # through `bgem3 serve`
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from bgem3_embeddings.checkpoint.files import DEFAULT_MODEL_ID
from bgem3_embeddings.cli_options import DeviceOpt, PrecisionOpt
from bgem3_embeddings.cli_support import CommandError, refuse_empty_texts
from bgem3_embeddings.explain.render import render
from bgem3_embeddings.explain.result import check_weights
from bgem3_embeddings.query_text import check_query
from bgem3_embeddings.scoring import DEFAULT_MODE_WEIGHTS

ENCODER_URL_ENV = "BGEM3_ENCODER_URL"
DEFAULT_WEIGHTS = ",".join(f"{w:g}" for w in DEFAULT_MODE_WEIGHTS)  # "0.4,0.2,0.4"


def parse_weights(text: str, option: str = "--weights") -> tuple[float, float, float]:
    """'0.4,0.2,0.4' -> (0.4, 0.2, 0.4): dense, sparse, colbert; typer.BadParameter naming the option."""
    try:
        return check_weights([float(x) for x in text.split(",")])
    except ValueError as err:
        raise typer.BadParameter(
            f"{err} (three numbers for dense,sparse,colbert, e.g. {DEFAULT_WEIGHTS})", param_hint=option
        ) from err


def explain_command(
    query: Annotated[str, typer.Argument(help="The query.")],
    passage: Annotated[str, typer.Argument(help="The passage.")],
    model: Annotated[
        str, typer.Option("--model", "-m", help="Hub id or local checkpoint folder.", envvar="BGEM3_MODEL")
    ] = DEFAULT_MODEL_ID,
    encoder_url: Annotated[
        str | None,
        typer.Option(
            "--encoder-url",
            envvar=ENCODER_URL_ENV,
            help="Explain through a running `bgem3 serve` at this URL (no TensorFlow in this process).",
        ),
    ] = None,
    encoder_api_key: Annotated[
        str | None,
        typer.Option("--encoder-api-key", envvar="BGEM3_ENCODER_API_KEY", help="The server's --api-key.",
                     show_default=False),
    ] = None,
    weights: Annotated[
        str, typer.Option(help="Weights of dense,sparse,colbert in the combined score (compute_score).")
    ] = DEFAULT_WEIGHTS,
    top: Annotated[int, typer.Option(min=0, help="Sparse terms and ColBERT matches shown (0: all).")] = 8,
    matrix: Annotated[
        bool, typer.Option("--matrix", help="With --json: add the query x passage ColBERT similarities.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the explanation as JSON.")] = False,
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
) -> None:
    """Explain one query-passage pair: each mode's score and the tokens that made it."""
    mode_weights = parse_weights(weights)
    try:
        check_query(query)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="QUERY") from err
    refuse_empty_texts([passage], "PASSAGE", "passage")
    encoder: Any
    if encoder_url:
        from bgem3_embeddings.remote import RemoteEncoder

        try:
            encoder = RemoteEncoder(encoder_url, api_key=encoder_api_key)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--encoder-url") from err
    else:
        from bgem3_embeddings.cli_support import load_encoder

        encoder = load_encoder(model, precision, device)
    try:
        explanation = encoder.explain(query, passage, weights=mode_weights, colbert_matrix=matrix)
    except (ValueError, TypeError) as err:
        raise CommandError(str(err)) from err
    if json_out:
        typer.echo(json.dumps(explanation.to_dict(), ensure_ascii=False))
        return
    for line in render(explanation, top_terms=top, top_matches=top):
        typer.echo(line)
