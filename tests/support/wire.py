"""``DYNLOCK_TEST_WIRE=boto3``: the suite through plain boto3 (the WIRE setting flipped).

Every ClientOptions left at the default WIRE (the settings' aliases, ``client_for``, the
tests' own) takes the environment's instead, in the pytest process, its workers and the
child processes the tests start (they inherit the variable and import ``tests.support``).
"""

from __future__ import annotations

import os

from django_dynlock.engine import options

VARIABLE = "DYNLOCK_TEST_WIRE"


def wire_under_test() -> str:
    """The WIRE this run tests: the environment's, else the default."""
    wire = os.environ.get(VARIABLE) or options.SETTING["wire"].default
    if not options.valid_wire(wire):
        raise SystemExit(f"{VARIABLE}={wire!r}: choose from {', '.join(options.WIRE_CHOICES)}")
    return wire


def apply() -> None:
    """Make the default WIRE this run's (once per process)."""
    wire = wire_under_test()
    if wire == options.SETTING["wire"].default or getattr(options.ClientOptions, "_test_wire", None):
        return
    post_init = options.ClientOptions.__post_init__

    def flipped(self: options.ClientOptions) -> None:
        if self.wire == options.SETTING["wire"].default:
            object.__setattr__(self, "wire", wire)
        post_init(self)

    options.ClientOptions.__post_init__ = flipped  # type: ignore[method-assign]
    options.ClientOptions._test_wire = wire  # type: ignore[attr-defined]
