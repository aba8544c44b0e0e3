"""The Ray engine: encoding runs in a Ray Data actor pool (one encoder per actor), results stream back.

The driver plans exactly as the plain engine does (same tokenizer, `BGEM3Tokenizer`, so the same chunks
and point ids) and imports neither TensorFlow nor torch: it reads the checkpoint's tokenizer and config
only. Each chunk's text travels once to an actor and once back (the payload travels without it).
Embedded stores are written by the driver through the ingestor's writer (only this process may open
them); a server is written by a pool of writer actors, each with the same Writer.

On a cluster (`ray_address`, joined by ray_connect.py) each actor loads the checkpoint from the same
path or hub id on its own node and checks that it is the driver's (the fingerprint the collection
records), so a node with other files stops the run instead of mixing models. A node lost mid-run costs
its actors and the batches they held: Ray restarts the actors on the nodes left and sends those batches
again (ACTOR_MAX_RESTARTS, ACTOR_MAX_TASK_RETRIES); point ids are fixed by the plan, so a batch encoded
twice is still stored once.

    >>> encoding = RayEncoding("BAAI/bge-m3", concurrency=4)          # doctest: +SKIP
    >>> Ingestor(store, "kb", encoding).ingest_paths(["corpus/"])     # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from bgem3_embeddings.install_hint import pip_install

from ..errors import BGEM3QdrantError
from ..schema import CollectionSchema
from ..stores.open import StoreTarget, open_store
from .encoding import Destination, EncodeResult, WrittenBatch
from .options import IngestOptions
from .ray_connect import join_ray
from .remote import RemoteEncoding
from .rows import unpack
from .worker import WorkerEncoder
from .writer import Writer

logger = logging.getLogger(__name__)
RAY_PIP = f"{pip_install('bgem3-qdrant[ray]')} (or {pip_install('ray[data,default]')})"
# Fault tolerance of both actor pools (Ray's actor options). An actor whose process or node dies is started
# again on a node with room, at most ACTOR_MAX_RESTARTS times per actor (Ray Data's default: forever). Each
# batch it held is sent again for as long as the actor may come back (-1): the cluster notices a lost node
# only after missed health checks, and until then every retry fails at once, so a finite count ran out
# before the restart in the node-loss test. The restarts bound the retries: once an actor is dead for good
# its batches fail. Encoding and upserts by point id are idempotent: a batch sent twice is stored once.
# Errors raised by our own code are not retried.
ACTOR_MAX_RESTARTS = 3
ACTOR_MAX_TASK_RETRIES = -1


def import_ray() -> Any:
    """ray, or an ImportError naming the pip install."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"the Ray engine needs Ray Data: {RAY_PIP}") from e
    return ray


def _this_node() -> str:
    """The Ray node this actor runs on, for messages: its address and the start of its id."""
    import ray

    return f"{ray.util.get_node_ip_address()} (id {ray.get_runtime_context().get_node_id()[:12]})"


def _our_error(ray: Any, e: BaseException) -> BGEM3QdrantError | None:
    """Our own error raised inside an actor, found in what Ray and Ray Data wrap it in. Ray's wrapper is
    also an instance of the original class, but its text carries the remote traceback: the original is
    the wrapper's `cause`."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        err = todo.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, BGEM3QdrantError) and not isinstance(err, ray.exceptions.RayError):
            if err.args and isinstance(err.args[0], str):
                # Ray Data appends its retry advice on new lines; our messages are one line.
                err.args = (err.args[0].split("\n", 1)[0], *err.args[1:])
            return err
        cause = getattr(err, "cause", None)
        todo += [err.__cause__, err.__context__, cause if isinstance(cause, BaseException) else None]
    return None


def _blocks(rows: int, batch_size: int, most: int = 200) -> int:
    """How many blocks to cut the rows into: at most `most` (Ray Data's own default), each a whole number
    of batches. Ray Data's even split would end most blocks with a batch of a row or two (an encoder call
    of its own); one block per batch would make a Ray task of every batch (slower: measured)."""
    per_block = batch_size * -(-rows // (most * batch_size))
    return max(1, -(-rows // per_block))


def _pool(size: int) -> Any:
    """A fixed-size Ray Data actor pool."""
    from ray.data import ActorPoolStrategy

    return ActorPoolStrategy(size=size)


def _retry_args(ray: Any) -> dict[str, int]:
    """The actor pools' retry options, where this Ray Data takes actor options in map_batches (deprecated in
    Ray 2.60, gone from 2.64: there Ray Data's own defaults apply, restarts and retries without end)."""
    params = inspect.signature(ray.data.Dataset.map_batches).parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):  # pragma: no cover - Ray >= 2.64
        return {}
    return {"max_restarts": ACTOR_MAX_RESTARTS, "max_task_retries": ACTOR_MAX_TASK_RETRIES}


@contextlib.contextmanager
def _quiet_deprecations() -> Iterator[None]:
    # The retry options above are the deprecated form; the warning would be the run's only output line.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        yield


# Ray's notice when the local instance it starts turns token authentication on by itself: a fact, not a
# problem, and the only line of a local ingest. Its opposite (authentication off: anyone on the network can
# run code on the cluster) is kept.
TOKEN_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
TOKEN_AUTH_ON_NOTICE = "Token authentication is enabled for this Ray cluster"


class _DropNotice(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


@contextlib.contextmanager
def _without_token_auth_notice() -> Iterator[None]:
    drop = _DropNotice(TOKEN_AUTH_ON_NOTICE)
    auth_logger = logging.getLogger(TOKEN_AUTH_LOGGER)
    auth_logger.addFilter(drop)
    try:
        yield
    finally:
        auth_logger.removeFilter(drop)


def pool_size(wanted: int, blocks: int) -> int:
    """Actors for an operator fed `blocks` blocks: no more than it has blocks (an actor with no block would
    load its model for nothing, and Ray Data warns that the pool is larger than its input)."""
    return max(1, min(wanted, blocks))


@contextlib.contextmanager
def _driver_output(verbose: bool) -> Iterator[None]:
    """What the driver shows while Ray runs: Ray Data's own log lines only with -v (the ingest has its own
    progress bar, and a failure reaches the user as the exception, one line, not also as Ray Data's logged
    traceback); the cluster's messages (a task retried, a node lost), which the Ray driver prints to
    stdout, on stderr, so that stdout holds only the command's result (--json)."""
    data_logger = logging.getLogger("ray.data")
    level = data_logger.level
    if not verbose:
        data_logger.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        data_logger.setLevel(level)


class EncodeActor(WorkerEncoder):
    """Ray Data callable class: one encoder per actor, built once in __init__ (worker.py)."""

    @staticmethod
    def where() -> str:
        return f"Ray node {_this_node()}"


class WriteActor:
    """Ray Data callable class writing encoded batches to a Qdrant server (one Writer per actor)."""

    def __init__(
        self,
        target: StoreTarget,
        collection: str,
        schema: CollectionSchema,
        retries: int,
        colbert_pooling: int = 1,
    ) -> None:
        self.writer = Writer(
            open_store(target), collection, schema, retries=retries, colbert_pooling=colbert_pooling
        )

    def __call__(self, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch = unpack(cols)
        self.writer.upsert_async(batch).result()
        return {"n": np.asarray([len(batch)]), "tokens": np.asarray([batch.tokens])}


class RayEncoding(RemoteEncoding):
    """Encoding in a Ray Data actor pool (`concurrency` actors, each loading `model` once).

    `target` is where the ingestor writes: with a server, `writers` writer actors write in parallel;
    an embedded store is always written by the driver. `ray_address` joins a cluster (default: start or
    attach to a local Ray). `encoder_kwargs` go to each actor's BGEM3Encoder (precision, device).
    """

    def __init__(
        self,
        model: str,
        *,
        concurrency: int = 2,
        writers: int = 2,
        target: StoreTarget | None = None,
        ray_address: str | None = None,
        encoder_kwargs: dict[str, Any] | None = None,
        num_cpus_per_actor: float = 1.0,
        ray_init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(model, encoder_kwargs)
        self.concurrency = concurrency
        self.writers = writers
        self.target = target
        self.ray_address = ray_address
        self.num_cpus_per_actor = num_cpus_per_actor
        self.ray_init_kwargs = dict(ray_init_kwargs or {})

    def finish(self, options: IngestOptions, destination: Destination) -> Iterator[EncodeResult]:
        rows = self.take_rows()
        if not rows:
            return
        ray = import_ray()
        verbose = logger.isEnabledFor(logging.INFO)  # -v
        joined = not ray.is_initialized()
        if joined:
            # Worker output (TensorFlow's start-up lines) stays in the session's log files unless -v.
            quiet = {"log_to_driver": verbose, "logging_level": logging.WARNING}
            with _without_token_auth_notice():
                join_ray(ray, self.ray_address, **{**quiet, **self.ray_init_kwargs})
        blocks = _blocks(len(rows), options.batch_size)
        actors = pool_size(self.concurrency, blocks)
        logger.info("encoding %d chunks (%d blocks) with %d Ray actors", len(rows), blocks, actors)
        if actors < self.concurrency:
            logger.info("%d encoder actors, not --concurrency %d: the chunks fill %d blocks of whole batches",
                        actors, self.concurrency, blocks)  # fmt: skip
        identity = self.identity()
        retries = _retry_args(ray)
        ds = ray.data.from_items(rows, override_num_blocks=blocks)
        # Our errors raised in an actor reach the driver as they are (Ray Data would wrap them in its own).
        ds.context.raise_original_map_exception = True
        with _quiet_deprecations():
            ds = ds.map_batches(
                EncodeActor,
                fn_constructor_kwargs={
                    "model": self.model_id,
                    "options": options,
                    "encoder_kwargs": self.encoder_kwargs,
                    "fingerprint": None if identity is None else identity.fingerprint,
                },
                batch_size=options.batch_size,
                compute=_pool(actors),
                num_cpus=self.num_cpus_per_actor,
                batch_format="numpy",
                **retries,
            )
        with _driver_output(verbose):
            try:
                yield from self._stream(ray, ds, options, destination, retries, blocks)
            finally:
                if joined:
                    # Leave the cluster once done: Ray's driver would print the cluster's late messages
                    # (a node declared dead after the last batch) on stdout until this process exits.
                    ray.shutdown()

    def _stream(
        self,
        ray: Any,
        ds: Any,
        options: IngestOptions,
        destination: Destination,
        retries: dict[str, int],
        blocks: int,
    ) -> Iterator[EncodeResult]:
        """Run the pipeline: encoded batches back to the driver's writer, or written by writer actors."""
        try:
            if destination.store.in_process or self.target is None or not self.target.is_server:
                # The store lives in this process: the ingestor's writer stores what streams back.
                for cols in ds.iter_batches(batch_size=None, batch_format="numpy"):
                    yield unpack(cols)
                return
            with _quiet_deprecations():
                ds = ds.map_batches(
                    WriteActor,
                    fn_constructor_kwargs={
                        "target": self.target,
                        "collection": destination.collection,
                        "schema": destination.schema,
                        "retries": options.retries,
                        "colbert_pooling": destination.colbert_pooling,
                    },
                    batch_size=None,
                    compute=_pool(pool_size(self.writers, blocks)),
                    num_cpus=0.25,
                    batch_format="numpy",
                    **retries,
                )
            for cols in ds.iter_batches(batch_size=None, batch_format="numpy"):
                yield WrittenBatch(int(np.sum(cols["n"])), int(np.sum(cols["tokens"])))
        except Exception as e:
            ours = _our_error(ray, e)
            if ours is None:
                raise
            raise ours from None
