"""A DynamoDB endpoint that answers every request with AccessDeniedException, in AWS's
words, in a process of its own (tests/commands/test_errors.py):

    python -m tests.support.deny_all      # prints its port, serves until stdin closes

Not in the test's process: there a server thread answers only when that process runs
Python, so any stall of it (the GIL held by another thread, a full garbage collection,
a process descheduled on a loaded machine) counts against the client's read timeout (2 s
in the suite, one attempt for create_table) and the test saw "no reply". In a process of
its own the reply waits in the socket for the client, however late the client reads it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from localdynamo.servers import REPO_ROOT

# IAM has no action named after a transaction (its entries have theirs): a text that names
# none, so that the client's hint has to.
TRANSACTION_DENIAL = "User: arn:aws:iam::123456789012:user/ci is not authorized to perform this operation"


def aws_denial(operation: str) -> str:
    """AWS's AccessDenied text: it names the principal and the refused action."""
    return (
        f"User: arn:aws:iam::123456789012:user/ci is not authorized to perform: dynamodb:{operation} on "
        f"resource: arn:aws:dynamodb:us-east-1:123456789012:table/ttt because no identity-based policy "
        f"allows the dynamodb:{operation} action"
    )


class DenyAll(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        operation = self.headers.get("X-Amz-Target", ".Unknown").rsplit(".", 1)[1]
        text = TRANSACTION_DENIAL if operation == "TransactWriteItems" else aws_denial(operation)
        body = json.dumps(
            {"__type": "com.amazonaws.dynamodb.v20120810#AccessDeniedException", "message": text}
        ).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class DenyAllServer:
    """``python -m tests.support.deny_all`` started and stopped (``stop()``)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.deny_all"],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        port = self.process.stdout.readline().strip()
        if not port.isdigit():
            self.stop()
            raise RuntimeError(f"the deny-all server did not start (it printed {port!r})")
        self.endpoint_url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()  # it exits when its stdin closes
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def main() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), DenyAll)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print(httpd.server_address[1], flush=True)
    sys.stdin.read()  # until the test process closes it, or dies
    httpd.shutdown()
    httpd.server_close()


if __name__ == "__main__":
    main()
