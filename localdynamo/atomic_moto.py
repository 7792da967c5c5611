"""moto's DynamoDB server, with each request applied atomically.

``python -m moto.server`` serves requests on many threads and its DynamoDB backend
has no locking, so two concurrent conditional UpdateItems on one item can both see
the old item and both succeed. Real DynamoDB applies each conditional write
atomically per item (and dynalite does too). Lock tests need that guarantee, so
this launcher runs the same moto application behind one lock: connections are
still handled in parallel, requests are applied one at a time.

Usage: python -m localdynamo.atomic_moto HOST PORT
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple


class Serialized:
    def __init__(self, app: Callable[..., Iterable[bytes]]):
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self.lock:
            # Consume the whole response inside the lock: the write is applied by then.
            return list(self.app(environ, start_response))


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = Serialized(DomainDispatcherApplication(create_backend_app))
    run_simple(host, port, app, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
