"""What the tests share that is not a fixture (fixtures live in the conftest files).

- ``aliases``: the ``DYNLOCK`` alias settings of the Django tests.
- ``calls``: counting the DynamoDB calls a LockClient makes.
- ``clients``: LockClients built from plain options, as another host would.
- ``commands``: running the management commands, in-process and as ``manage.py``.
- ``endpoint``: ``make test-endpoint``'s endpoint and the cleanup of its tables.
- ``malformed``: lock-table items the library did not write.
- ``tables``: fresh lock tables, from the shipped ``lock_table()``.
- ``tools``: skipping (or, under CI, failing) a test whose tooling is missing.
- ``wallclock``: a process' wall clock set wrong on purpose.
- ``workers`` and ``takeover_child``: code that runs in the child processes.
- ``decorated_views``: the URLconf of tests/test_decorator.py.
- ``admin_server``: the test project served for real, for the browser test.
- ``endpoint_cost``: ``python -m tests.support.endpoint_cost URL`` (docs/testing.md).
- ``wire``: ``DYNLOCK_TEST_WIRE=boto3``, the run through plain boto3, applied on import here.
"""

from tests.support import wire as _wire

_wire.apply()
