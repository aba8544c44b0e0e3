"""The ClientApp every SuperNode runs: a round's `train` message -> LoRA training on this node's own data;
the last message (`train.reindex`) -> the shared model saved and the collection written again with it.

A reply holds the adapter's arrays and the example count only (records.py checks the names). A node that
cannot take part (no data, no collection, a bad --node-config) replies with one line as the message's error,
which the ServerApp logs; it never sends a traceback or any of its data.
"""

from __future__ import annotations

from logging import ERROR, INFO

from flwr.app import Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore import log as flwr_log

from ..errors import BGEM3QdrantError
from . import node as node_work
from .records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, adapter_in, from_record, to_record
from .settings import NodeSettings, RunSettings

REINDEX = "reindex"  # the action of the last message: `train.reindex`
NODE_ERROR = 100  # the Error code of a node's one-line refusal (Flower's own codes are below 10)

app = ClientApp()


def _refusal(message: Message, context: Context, err: Exception) -> Message:
    line = f"{err}".splitlines()[0] if f"{err}" else type(err).__name__
    flwr_log(ERROR, "bgem3 node: %s", line)
    return Message(Error(code=NODE_ERROR, reason=line), reply_to=message)


def _settings(message: Message, context: Context) -> tuple[NodeSettings, RunSettings]:
    run = RunSettings.from_config({**context.run_config, **dict(message.content[CONFIG].items())})
    return NodeSettings.from_config(context.node_config), run


@app.train()
def train(message: Message, context: Context) -> Message:
    """One round: train from the received adapter, reply with the trained one and the example count."""
    try:
        node, run = _settings(message, context)
        server_round = message.content[CONFIG]["server-round"]
        flwr_log(INFO, "bgem3 node %s: round %s: training", node.collection, server_round)
        received = adapter_in(message.content)
        start = from_record(received) if len(received) else None
        trained, examples = node_work.train_round(node, run, start)
    except (BGEM3QdrantError, ValueError, OSError) as err:
        return _refusal(message, context, err)
    reply = RecordDict({ARRAYS: to_record(trained), METRICS: MetricRecord({NUM_EXAMPLES: examples})})
    return Message(reply, reply_to=message)


@app.train(REINDEX)
def reindex(message: Message, context: Context) -> Message:
    """After the last round: save the shared model here and re-encode the collection with it."""
    try:
        node, run = _settings(message, context)
        summary = node_work.finish(node, run, from_record(adapter_in(message.content)))
    except (BGEM3QdrantError, ValueError, OSError) as err:
        return _refusal(message, context, err)
    return Message(RecordDict({METRICS: MetricRecord({"points": int(summary["points"])})}), reply_to=message)
