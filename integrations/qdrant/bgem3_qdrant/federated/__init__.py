"""Federated tuning with Flower (issue 57): teams train one LoRA adapter together, each on its own
collection, and only the adapter's arrays and an example count ever leave a machine.

    pyproject.toml  the Flower App (`flwr run` on this folder; `bgem3-qdrant federate` runs it)
    settings.py     the run config (ServerApp) and node config (each SuperNode) as typed settings
    records.py      adapter arrays <-> Flower's ArrayRecord, and the audit record of every message
    node.py         one node's work: its training data (mined from its collection), a round of LoRA
                    training from the received adapter, the reindex with the shared model at the end
    client_app.py   the ClientApp: Flower messages -> node.py
    server_app.py   the ServerApp: FedAvg over the adapters weighted by example count, then the reindex

Nothing here imports Flower or TensorFlow at package import.
"""

from pathlib import Path

APP_DIR = Path(__file__).resolve().parent  # the Flower App folder (holds its pyproject.toml)
