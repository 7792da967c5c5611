"""Tests for localdynamo/servers.py (local moto / dynalite servers).

No Django settings are needed: these only start and stop processes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from localdynamo import servers


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists but not ours (pgid reused): not our server
        return False
    return True


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection((servers.LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def _assert_fully_stopped(server: servers.LocalServer) -> None:
    assert server.process.poll() is not None, "server leader process still running"
    # The whole process group (node/python and any children) must be gone.
    deadline = time.monotonic() + 5.0
    for _ in range(50):
        if not _group_alive(server.pid) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not _group_alive(server.pid), "processes left in the server's process group"
    assert not _accepts_connections(server.port), "port still accepting connections"
    assert server not in servers._running


def _exercise(server: servers.LocalServer, kind: str) -> None:
    assert server.kind == kind
    assert server.endpoint_url == f"http://127.0.0.1:{server.port}"
    assert server.is_running()
    client = servers.dummy_client(server.endpoint_url)
    try:
        assert client.list_tables()["TableNames"] == []
        client.create_table(
            TableName="dynlock_probe",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        client.get_waiter("table_exists").wait(
            TableName="dynlock_probe", WaiterConfig={"Delay": 0.2, "MaxAttempts": 50}
        )
        client.put_item(TableName="dynlock_probe", Item={"pk": {"S": "k"}})
        item = client.get_item(TableName="dynlock_probe", Key={"pk": {"S": "k"}})
        assert item["Item"] == {"pk": {"S": "k"}}
        assert client.list_tables()["TableNames"] == ["dynlock_probe"]
    finally:
        client.close()


def _require_dynalite() -> None:
    if servers.dynalite_path() is not None:
        return
    from tests.support.tools import missing_tool

    missing_tool(
        f"dynalite is not installed (expected {servers.REPO_ROOT / 'node_modules' / '.bin' / 'dynalite'}); "
        "run `make node`"
    )


# --------------------------------------------------------------------------- moto


def test_moto_server_starts_answers_and_stops():
    server = servers.start_moto_server()
    try:
        _exercise(server, "moto")
        assert "127.0.0.1" in server.log_tail()
    finally:
        server.stop()
    _assert_fully_stopped(server)
    server.stop()  # idempotent
    assert isinstance(server.log_tail(), str)  # still readable after stop


def test_moto_server_context_manager():
    with servers.start_moto_server() as server:
        assert server.is_running()
    _assert_fully_stopped(server)
    assert not server.is_running()


def test_two_servers_are_independent():
    with servers.start_moto_server() as a, servers.start_moto_server() as b:
        assert a.port != b.port
        ca, cb = servers.dummy_client(a.endpoint_url), servers.dummy_client(b.endpoint_url)
        try:
            ca.create_table(
                TableName="only_in_a",
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                BillingMode="PAY_PER_REQUEST",
            )
            assert ca.list_tables()["TableNames"] == ["only_in_a"]
            assert cb.list_tables()["TableNames"] == []
        finally:
            ca.close()
            cb.close()
    _assert_fully_stopped(a)
    _assert_fully_stopped(b)


def test_fixed_port_in_use_is_a_clear_error():
    with socket.socket() as sock:
        sock.bind((servers.LOOPBACK, 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        with pytest.raises(servers.PortInUseError, match=f"127.0.0.1:{port} is already in use"):
            servers.start_moto_server(port=port, timeout=5.0)
    assert issubclass(servers.PortInUseError, RuntimeError)


def test_fixed_port_is_used():
    port = servers.free_port()
    with servers.start_moto_server(port=port) as server:
        assert server.port == port
        assert server.endpoint_url == f"http://127.0.0.1:{port}"
    _assert_fully_stopped(server)


SENTINEL = "zq7SENTINELx91"  # must not appear anywhere in a server's environment


def test_server_env_hides_developer_credentials(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA" + SENTINEL)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SENTINEL + "-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", SENTINEL + "-token")
    monkeypatch.setenv("AWS_PROFILE", SENTINEL + "-profile")
    env = servers.server_env()
    leaked = [k for k, v in env.items() if SENTINEL in v]
    assert leaked == []
    assert env["AWS_ACCESS_KEY_ID"] == servers.DUMMY_CREDENTIALS["aws_access_key_id"]
    assert "AWS_PROFILE" not in env and "AWS_SESSION_TOKEN" not in env

    with servers.start_moto_server() as server:
        environ_file = f"/proc/{server.pid}/environ"
        if os.path.exists(environ_file):
            with open(environ_file, "rb") as fh:
                assert SENTINEL.encode() not in fh.read()


def test_readiness_timeout_raises_with_log_tail(monkeypatch):
    # A "server" that prints something and never answers HTTP.
    def fake_command(port, host):
        return [
            servers.sys.executable,
            "-c",
            "import time; print('fake server booting', flush=True); time.sleep(60)",
        ]

    monkeypatch.setattr(servers, "moto_command", fake_command)
    before = set(servers._running)  # session-scoped servers from conftest may be running
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="fake server booting"):
        servers.start_moto_server(timeout=1.5)
    assert time.monotonic() - started < 15
    assert servers._running == before


def test_server_exiting_early_is_reported(monkeypatch):
    def failing_command(port, host):
        return [servers.sys.executable, "-c", "import sys; print('cannot bind'); sys.exit(3)"]

    monkeypatch.setattr(servers, "moto_command", failing_command)
    before = set(servers._running)
    with pytest.raises(servers.ServerStartError, match="cannot bind") as info:
        servers.start_moto_server(timeout=10.0)
    # each retry on a fresh port is reported
    assert "attempt 3" in str(info.value)
    assert servers._running == before


def test_stop_all_servers(monkeypatch):
    # Private registry so that servers owned by conftest fixtures stay up.
    monkeypatch.setattr(servers, "_running", set())
    a = servers.start_moto_server()
    b = servers.start_moto_server()
    assert servers._running == {a, b}
    servers.stop_all_servers()
    _assert_fully_stopped(a)
    _assert_fully_stopped(b)
    assert servers._running == set()


def test_atexit_stops_forgotten_servers():
    # A child interpreter starts a server, never stops it, and exits normally.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from localdynamo import servers; "
        "s = servers.start_moto_server(); print(s.pid, s.port, flush=True)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(servers.REPO_ROOT)],
        capture_output=True,
        text=True,
        timeout=60,
        env=servers.server_env(),
    )
    assert result.returncode == 0, result.stderr
    pid, port = map(int, result.stdout.split())
    deadline = time.monotonic() + 5.0
    for _ in range(50):
        if not _group_alive(pid) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not _group_alive(pid), "atexit hook left the server running"
    assert not _accepts_connections(port)


# ---------------------------------------------------------------------- dynalite


@pytest.mark.dynalite
def test_dynalite_starts_answers_and_stops():
    _require_dynalite()
    server = servers.start_dynalite()
    try:
        _exercise(server, "dynalite")
        assert "listening" in server.log_tail().lower()
    finally:
        server.stop()
    _assert_fully_stopped(server)
    server.stop()  # idempotent


@pytest.mark.dynalite
def test_dynalite_listens_on_loopback_only():
    _require_dynalite()
    with servers.start_dynalite() as server:
        assert f"127.0.0.1:{server.port}" in server.log_tail()
        # Not reachable through a non-loopback address of this host, if any.
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
        except OSError:
            addresses = set()
        for address in addresses - {"127.0.0.1"}:
            if address.startswith("127."):
                continue
            with socket.socket() as sock:
                sock.settimeout(0.5)
                assert sock.connect_ex((address, server.port)) != 0
    _assert_fully_stopped(server)


def test_start_server_dispatch():
    with pytest.raises(ValueError, match="dynamodb-local, moto, dynalite"):
        servers.start_server("dynamo")


# ------------------------------------------------------------------ DynamoDB Local


def test_dynamodb_local_starts_answers_and_stops():
    # AWS's own DynamoDB Local, the reference server (issue 15 makes it a server of the
    # test matrix; the benchmarks use it already).
    from tests.support.tools import need_dynamodb_local

    need_dynamodb_local()
    server = servers.start_dynamodb_local()
    try:
        _exercise(server, "dynamodb-local")
        client = servers.dummy_client(server.endpoint_url)
        try:
            reply = client.list_tables()
            # It stamps every reply with a Date, by which the engine takes over expired leases.
            assert reply["ResponseMetadata"]["HTTPHeaders"]["date"].endswith("GMT")
        finally:
            client.close()
    finally:
        server.stop()
    _assert_fully_stopped(server)
