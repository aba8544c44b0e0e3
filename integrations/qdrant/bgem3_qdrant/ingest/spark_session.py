"""A Spark session for the Spark engine and the DataFrame API: checked first, quiet, on loopback.

Before Spark is involved: pyspark installed, a `java` to run it, and a `spark://` master that accepts
connections (Spark itself would retry a dead master for a minute and then print a stack trace). The JVM's
output (log4j lines, the console progress bar, the executors' Python workers in local mode) goes to a log
file, not to the terminal; -v leaves it on stderr. A failed Spark job becomes one line: a worker whose Python
cannot import the package, our own error raised in an executor, or the job's last error line and the log.

When the master is local or on loopback, every Spark process of the run binds 127.0.0.1 (SPARK_LOCAL_IP and
the driver's host): otherwise Spark picks the machine's interface address and traffic leaves loopback.

    >>> with spark_session("local[2]", "demo") as spark:      # doctest: +SKIP
    ...     spark.range(3).count()
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bgem3_embeddings.install_hint import pip_install

from ..errors import BGEM3QdrantError
from .ray_connect import LOOPBACK_HOSTS, answers

logger = logging.getLogger(__name__)
SPARK_PIP = f"{pip_install('bgem3-qdrant[spark]')} (or {pip_install('pyspark>=4')})"
JAVA_HINT = "install Java 17 (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
DEFAULT_MASTER = "local[*]"
# pyspark 4 warns at every pandas conversion that pandas 3 is not fully supported; its Arrow path, the only
# one used here, is tested with pandas 3 in this project's tests.
PANDAS_NOTICE = "PySpark does not yet fully support pandas"


class SparkSetupError(BGEM3QdrantError):
    """Spark cannot start here: pyspark or Java missing, or no master at --spark-master."""


class SparkJobError(BGEM3QdrantError):
    """A Spark job failed (the message is its cause, in one line)."""


def import_pyspark() -> Any:
    """pyspark, or a SparkSetupError naming the pip install."""
    try:
        import pyspark
        import pyspark.sql  # noqa: F401
    except ImportError as e:
        raise SparkSetupError(f"the Spark engine needs pyspark: {SPARK_PIP}") from e
    return pyspark


def find_java() -> str:
    """The java Spark will run ($JAVA_HOME/bin/java, else java on PATH), or a SparkSetupError."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if java.is_file() and os.access(java, os.X_OK):
            return str(java)
        raise SparkSetupError(f"JAVA_HOME={home} has no bin/java: {JAVA_HINT}")
    found = shutil.which("java")
    if found is None:
        raise SparkSetupError(f"Spark runs on Java and no java is on PATH: {JAVA_HINT}")
    return found


def master_hosts(master: str) -> list[tuple[str, int]]:
    """(host, port) of each master of a spark:// URL (several for standby masters); [] for local[...] and
    the schemes Spark resolves itself (yarn, k8s://)."""
    if not master.startswith("spark://"):
        return []
    hosts = []
    for part in master[len("spark://") :].split(","):
        parsed = urlsplit(f"spark://{part}")
        try:
            port = parsed.port or 7077
        except ValueError:
            port = None
        if not parsed.hostname or port is None:
            raise SparkSetupError(
                f"--spark-master {master!r} is not spark://host:port (e.g. spark://10.0.0.5:7077)"
            )
        hosts.append((parsed.hostname, port))
    return hosts


def check_master(master: str) -> None:
    """A SparkSetupError at once when no master of a spark:// URL accepts connections."""
    hosts = master_hosts(master)
    if hosts and not any(answers(host, port) for host, port in hosts):
        raise SparkSetupError(
            f"no Spark master answers at {master} (--spark-master): start one with `spark-class "
            "org.apache.spark.deploy.master.Master --host HOST --port 7077` and its workers, or check the "
            "host, port and firewall"
        )


def on_loopback(master: str) -> bool:
    """Whether the run stays on this machine: local[...] or masters on loopback only."""
    hosts = master_hosts(master)
    if master.startswith("local"):
        return True
    return bool(hosts) and all(host in LOOPBACK_HOSTS for host, _ in hosts)


def local_master(concurrency: int | None) -> str:
    """The local master: `local[N]` for N tasks at once, all cores when N is not given."""
    return DEFAULT_MASTER if concurrency is None else f"local[{concurrency}]"


@contextlib.contextmanager
def _stderr_to(path: Path | None) -> Iterator[None]:
    """File descriptor 2 sent to `path` while the JVM starts, so the JVM and everything it starts write there
    for good (the JVM inherits the descriptor); this process's own stderr is restored after."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def spark_session(
    master: str | None,
    app_name: str,
    *,
    concurrency: int | None = None,
    conf: dict[str, str] | None = None,
    verbose: bool = False,
) -> Iterator[Any]:
    """A SparkSession on `master` (None: local, `concurrency` tasks at once), stopped at the end.

    On a cluster, `concurrency` caps the cores the application takes (spark.cores.max). The workers' Python
    is this interpreter unless PYSPARK_PYTHON says otherwise (the same path on every worker). Spark
    settings of your own: `conf`, or Spark's spark-defaults.conf in SPARK_CONF_DIR.
    """
    import_pyspark()
    find_java()
    master = master or local_master(concurrency)
    check_master(master)
    settings = {
        # Our own progress bar and one line per failure; Spark's console bar would mix with them.
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        **(conf or {}),
    }
    if concurrency is not None and not master.startswith("local"):
        settings.setdefault("spark.cores.max", str(concurrency))
    if on_loopback(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings.setdefault("spark.driver.host", "127.0.0.1")
        settings.setdefault("spark.driver.bindAddress", "127.0.0.1")
    # pyspark's workers run PYSPARK_PYTHON (default: the `python3` on the worker's PATH, without this
    # package); the driver's interpreter is the right one wherever the workers share this machine's paths.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    log = None if verbose else Path(tempfile.mkstemp(prefix="bgem3-qdrant-spark-", suffix=".log")[1])
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=f".*{PANDAS_NOTICE}")
        with _stderr_to(log):
            try:
                spark = builder.getOrCreate()
            except Exception as e:
                raise SparkSetupError(f"Spark did not start: {_last_line(str(e))}{_see(log)}") from None
        if not verbose:
            spark.sparkContext.setLogLevel("ERROR")
        logger.info("Spark %s on %s (JVM log: %s)", spark.version, master, log or "stderr")
        try:
            yield spark
        except Exception as e:
            raise job_error(e, log) from None
        finally:
            with _stderr_to(log):
                spark.stop()


def _see(log: Path | None) -> str:
    return "" if log is None else f" (Spark's log: {log})"


def _last_line(text: str) -> str:
    """The last non-empty line of an exception's text that is not a stack frame."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("at ", "File ", "^", "..."))]
    return lines[-1] if lines else text.strip()


# What a Python worker's traceback ends with, as the JVM hands it back inside the job's error.
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")
_OUR_ERROR = re.compile(r"bgem3_qdrant\.[\w.]+\.(\w+Error): (.+)")


def job_error(e: BaseException, log: Path | None = None) -> BaseException:
    """The one-line error a failed Spark call stands for (our errors pass through as they are)."""
    if isinstance(e, BGEM3QdrantError) or not _from_spark(e):
        return e
    text = str(e)
    missing = _MISSING_MODULE.search(text)
    if missing:
        return SparkJobError(
            f"a Spark worker's Python cannot import {missing.group(1)!r}: install bgem3-qdrant[spark] into "
            "the Python every worker runs (PYSPARK_PYTHON, the same path on each machine)"
        )
    ours = _OUR_ERROR.search(text)
    if ours:
        return _our_class(ours.group(1))(ours.group(2).strip())
    return SparkJobError(f"the Spark job failed: {_last_line(text)}{_see(log)}")


def _from_spark(e: BaseException) -> bool:
    module = type(e).__module__ or ""
    return module.startswith(("pyspark", "py4j"))


def _our_class(name: str) -> type[BGEM3QdrantError]:
    """The class of our error named in an executor's traceback (SparkJobError for one not known here)."""
    from .worker import CheckpointMismatchError

    known: dict[str, type[BGEM3QdrantError]] = {"CheckpointMismatchError": CheckpointMismatchError}
    return known.get(name, SparkJobError)
