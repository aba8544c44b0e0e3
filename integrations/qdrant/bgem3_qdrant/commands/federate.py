"""`bgem3-qdrant federate --superlink HOST:PORT`: run the federated tuning App (bgem3_qdrant/federated) on a
Flower federation: `flwr run` on the App, with a Flower configuration of its own that names the SuperLink
(the user's ~/.flwr is neither read nor written), the run's log streamed here."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import BGEM3QdrantError
from .common import VerboseOpt, setup_logging

CONNECTION = "bgem3"  # the SuperLink connection's name in the Flower configuration written for the run


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_connection(superlink: str, insecure: bool, root_certificates: Path | None) -> None:
    """One line for a SuperLink address or security choice that cannot work, before anything starts."""
    host, _, port = superlink.rpartition(":")
    if not host or not port.isdigit():
        raise BGEM3QdrantError(f"--superlink: HOST:PORT expected (e.g. 127.0.0.1:9093), got {superlink!r}")
    if insecure and root_certificates is not None:
        raise BGEM3QdrantError("--insecure and --root-certificates: choose one")
    if insecure and not _is_loopback(superlink):
        raise BGEM3QdrantError(
            f"--insecure: {superlink} is not this machine; between machines use TLS (--root-certificates "
            "CA.pem, the CA that signed the SuperLink's certificate): docs/federated.md says how"
        )
    if root_certificates is not None and not root_certificates.is_file():
        raise BGEM3QdrantError(f"--root-certificates: no file at {root_certificates}")


def flwr_command() -> str:
    """The `flwr` CLI of this environment, or one line naming the extra that installs it."""
    from bgem3_embeddings.install_hint import pip_install

    beside = Path(sys.executable).parent / "flwr"
    found = str(beside) if beside.is_file() else shutil.which("flwr")
    if found is None:
        raise BGEM3QdrantError(
            f"federate needs Flower (flwr), not installed: run {pip_install('bgem3-qdrant[federated]')}"
        )
    return found


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def run_config_line(values: dict[str, Any], extra: str | None) -> str:
    """flwr's --run-config value: the options given (None left to the App's defaults), then `extra`."""
    words = [f"{key}={_toml_value(v)}" for key, v in values.items() if v is not None]
    return " ".join([*words, *([extra] if extra else [])])


def write_flower_config(home: Path, superlink: str, insecure: bool, root_certificates: Path | None) -> None:
    """FLWR_HOME/config.toml with the one SuperLink connection this run uses."""
    lines = ["[superlink]", f'default = "{CONNECTION}"', "", f"[superlink.{CONNECTION}]"]
    lines.append(f'address = "{superlink}"')
    if insecure:
        lines.append("insecure = true")
    if root_certificates is not None:
        lines.append(f'root-certificates = "{root_certificates.resolve()}"')
    (home / "config.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")


def federate(
    superlink: Annotated[
        str, typer.Option("--superlink", help="The SuperLink's address for `flwr` (HOST:PORT).")
    ],
    insecure: Annotated[
        bool, typer.Option("--insecure", help="No TLS: only to a SuperLink on this machine (loopback).")
    ] = False,
    root_certificates: Annotated[
        Path | None,
        typer.Option("--root-certificates", help="The CA certificate (PEM) that signed the SuperLink's."),
    ] = None,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="Rounds (App default: 3).")] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="The base model each node loads (BAAI/bge-m3)."),
    ] = None,
    lora_rank: Annotated[int | None, typer.Option("--lora-rank", min=1, help="Adapter rank (8).")] = None,
    learning_rate: Annotated[float | None, typer.Option("--learning-rate", help="(1e-4)")] = None,
    local_epochs: Annotated[
        float | None, typer.Option("--local-epochs", help="Epochs over a node's data per round (1).")
    ] = None,
    min_nodes: Annotated[
        int | None, typer.Option("--min-nodes", min=1, help="Nodes each round waits for (2).")
    ] = None,
    no_reindex: Annotated[
        bool, typer.Option("--no-reindex", help="Save the shared model on each node, write no collection.")
    ] = False,
    record: Annotated[
        Path | None,
        typer.Option("--record", help="Folder (on the SuperLink's machine) for every message's contents."),
    ] = None,
    run_config: Annotated[
        str | None,
        typer.Option("--run-config", help="More of the App's run config, as flwr takes it: 'key=value ...'."),
    ] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Tune one LoRA adapter across the collections of a Flower federation: each SuperNode mines and trains
    on its own collection, only adapters and example counts travel, and each node re-indexes at the end."""
    setup_logging(verbose)
    check_connection(superlink, insecure, root_certificates)
    flwr = flwr_command()
    from ..federated import APP_DIR

    values: dict[str, Any] = {
        "num-server-rounds": rounds,
        "model": model,
        "lora-rank": lora_rank,
        "learning-rate": learning_rate,
        "local-epochs": local_epochs,
        "min-nodes": min_nodes,
        "reindex": False if no_reindex else None,
        "record-dir": str(record.resolve()) if record is not None else None,
    }
    overrides = run_config_line(values, run_config)
    with tempfile.TemporaryDirectory(prefix="bgem3-flwr-") as home:
        write_flower_config(Path(home), superlink, insecure, root_certificates)
        command = [flwr, "run", str(APP_DIR), CONNECTION, "--stream"]
        if overrides:
            command += ["--run-config", overrides]
        done = subprocess.run(command, env=dict(os.environ, FLWR_HOME=home), check=False)
    if done.returncode != 0:
        raise typer.Exit(done.returncode)
