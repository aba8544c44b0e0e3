"""The ServerApp: Flower's FedAvg over the nodes' LoRA adapters, weighted by their example counts, for
`num-server-rounds` rounds; then every connected node gets the shared adapter (`train.reindex`) to save the
tuned model and re-encode its collection. The server never holds a base weight: the first round sends an
empty ArrayRecord and every node starts from the same seeded adapter.

A node that fails or drops out of a round (killed, cut off: the SuperLink marks it offline after its missed
heartbeats) costs only its own reply; the round aggregates the others, and a restarted node is sampled
again from the next round on.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import ERROR, INFO, WARNING
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.supercore import log as flwr_log

from .client_app import REINDEX
from .records import ARRAYS, CONFIG, MessageLog, adapter_in, check_adapter
from .settings import RunSettings

app = ServerApp()


class AdapterFedAvg(FedAvg):
    """FedAvg that checks every reply is a LoRA adapter of the run's rank (a base weight or anything else
    fails the reply, not the run) and, given a MessageLog, records each message and aggregate."""

    def __init__(self, settings: RunSettings, log: MessageLog | None) -> None:
        nodes = settings.min_nodes
        super().__init__(
            fraction_evaluate=0.0, min_train_nodes=nodes, min_available_nodes=nodes, min_evaluate_nodes=0
        )
        self.settings = settings
        self.log = log
        self.sent: list[Message] = []

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self.sent = messages
        for message in messages:
            if self.log:
                self.log.write("sent", server_round, message)
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        kept = []
        for reply in replies:
            if self.log:
                self.log.write("received", server_round, reply, node=reply_node(reply, self.sent))
            if reply.has_error():
                node = reply_node(reply, self.sent)
                reason = reply.error.reason
                if node != reply.metadata.src_node_id:  # the SuperLink's reply, which FedAvg's line misnames
                    flwr_log(WARNING, "node %d: left out of round %d: %s", node, server_round, reason)
            else:
                problem = _adapter_problem(reply, self.settings.lora_rank)
                if problem:
                    flwr_log(WARNING, "node %d: reply refused: %s", reply_node(reply, self.sent), problem)
                    continue
            kept.append(reply)
        arrays, metrics = super().aggregate_train(server_round, kept)
        if arrays is not None and self.log:
            self.log.write_arrays("aggregate", server_round, arrays)
        return arrays, metrics


def reply_node(reply: Message, sent: list[Message]) -> int:
    """The node a reply answers for: its sender, or for the SuperLink's own reply (a node gone offline)
    the node the message it answers went to (the grid set each sent message's id when it pushed it)."""
    for message in sent:
        if message.metadata.message_id == reply.metadata.reply_to_message_id:
            return int(message.metadata.dst_node_id)
    return int(reply.metadata.src_node_id)


def _adapter_problem(reply: Message, rank: int) -> str | None:
    content = reply.content
    if set(content.keys()) != {ARRAYS, "metrics"}:
        return f"records {sorted(content.keys())}, expected arrays and metrics"
    try:
        check_adapter({name: tuple(a.shape) for name, a in adapter_in(content).items()}, rank)
    except ValueError as err:
        return str(err)
    return None


def reindex_everywhere(
    grid: Grid, settings: RunSettings, arrays: ArrayRecord, log: MessageLog | None
) -> None:
    """Send the shared adapter to every connected node (`train.reindex`) and log what each did."""
    nodes = list(grid.get_node_ids())
    config = ConfigRecord(settings.as_config())
    messages = [
        Message(
            RecordDict({ARRAYS: arrays, CONFIG: config}),
            dst_node_id=node,
            message_type=f"{MessageType.TRAIN}.{REINDEX}",
        )
        for node in nodes
    ]
    last = settings.num_server_rounds + 1
    for message in messages:
        if log:
            log.write("sent", last, message)
    for reply in grid.send_and_receive(messages, timeout=settings.round_timeout or None):
        node = reply_node(reply, messages)
        if log:
            log.write("received", last, reply, node=node)
        if reply.has_error():
            flwr_log(WARNING, "node %d: no reindex: %s", node, reply.error.reason)
        else:
            points = reply.content["metrics"]["points"]
            flwr_log(INFO, "node %d: reindexed %d points with the shared model", node, points)


@app.main()
def main(grid: Grid, context: Context) -> None:
    settings = RunSettings.from_config(context.run_config)
    log = MessageLog(Path(settings.record_dir)) if settings.record_dir else None
    strategy = AdapterFedAvg(settings, log)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(),
        num_rounds=settings.num_server_rounds,
        timeout=settings.round_timeout or 3600 * 24,
        train_config=ConfigRecord(settings.as_config()),
    )
    if len(result.arrays) == 0:
        flwr_log(ERROR, "no node trained in any round: nothing to share (each node's line above says why)")
        return
    if settings.reindex:
        reindex_everywhere(grid, settings, result.arrays, log)
