"""``make test-endpoint``: the suite against an endpoint it did not start (docs/testing.md)."""

from __future__ import annotations

from localdynamo.servers import TABLE_PREFIX, dummy_client


class Endpoint:
    """DYNLOCK_TEST_ENDPOINT as the suite's ``server``: started and stopped by someone else."""

    kind = "endpoint"

    def __init__(self, endpoint_url: str) -> None:
        self.endpoint_url = endpoint_url

    def __repr__(self) -> str:
        return f"<Endpoint {self.endpoint_url}>"


def delete_tables_of_this_run(endpoint_url: str) -> list[str]:
    """Delete the tables named with TABLE_PREFIX at ``endpoint_url``; return those still listed."""
    client = dummy_client(endpoint_url, read_timeout=30, max_attempts=5)
    try:

        def ours() -> list[str]:
            names, start = [], {}
            for _ in range(1000):  # pages of 100 tables
                page = client.list_tables(**start)
                names += [n for n in page.get("TableNames", []) if n.startswith(TABLE_PREFIX)]
                if "LastEvaluatedTableName" not in page:
                    break
                start = {"ExclusiveStartTableName": page["LastEvaluatedTableName"]}
            return names

        for name in ours():
            try:
                client.delete_table(TableName=name)
                client.get_waiter("table_not_exists").wait(TableName=name, WaiterConfig={"Delay": 2, "MaxAttempts": 60})
            except client.exceptions.ResourceNotFoundException:
                pass
        return ours()
    finally:
        client.close()
