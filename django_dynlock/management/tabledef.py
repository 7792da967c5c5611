"""The lock table as requests and as CloudFormation, for ``createlocktable --print``.

Printed from the definition ``engine.table.create_table`` uses (``table_definition``
and ``ttl_specification``): partition key only (``KEY_ATTRIBUTE``, a string) and TTL
on ``TTL_ATTRIBUTE``. The tests also create a table from this output (API requests and
a CloudFormation stack on moto) and run leases on it.
"""

from __future__ import annotations

import json
from typing import Any

from ..engine.options import ClientOptions
from ..engine.table import table_definition, ttl_specification


def ttl_request(options: ClientOptions) -> dict[str, Any]:
    """UpdateTimeToLive parameters (``aws dynamodb update-time-to-live --cli-input-json``)."""
    return {"TableName": options.table_name, "TimeToLiveSpecification": ttl_specification(options)}


def _q(value: str) -> str:
    # A JSON string is a valid double-quoted YAML scalar: names such as "on" or
    # "yes" stay strings instead of turning into booleans.
    return json.dumps(value)


def cloudformation(options: ClientOptions, billing_mode: str, read: int | None, write: int | None) -> str:
    """A CloudFormation (YAML) ``Resources`` block with the table and its TTL."""
    table = table_definition(options, billing_mode=billing_mode, read_capacity=read, write_capacity=write)
    ttl = ttl_specification(options)
    lines = [
        "Resources:",
        "  DynLockTable:",
        "    Type: AWS::DynamoDB::Table",
        # Keep the table when the stack goes: deleting it would drop every live lease.
        "    DeletionPolicy: Retain",
        "    UpdateReplacePolicy: Retain",
        "    Properties:",
        f"      TableName: {_q(table['TableName'])}",
        f"      BillingMode: {table['BillingMode']}",
        "      AttributeDefinitions:",
    ]
    for attribute in table["AttributeDefinitions"]:
        lines += [
            f"        - AttributeName: {_q(attribute['AttributeName'])}",
            f"          AttributeType: {attribute['AttributeType']}",
        ]
    lines.append("      KeySchema:")
    for key in table["KeySchema"]:
        lines += [f"        - AttributeName: {_q(key['AttributeName'])}", f"          KeyType: {key['KeyType']}"]
    if "ProvisionedThroughput" in table:
        lines.append("      ProvisionedThroughput:")
        lines += [f"        {name}: {units}" for name, units in table["ProvisionedThroughput"].items()]
    lines += [
        "      TimeToLiveSpecification:",
        f"        AttributeName: {_q(ttl['AttributeName'])}",
        f"        Enabled: {'true' if ttl['Enabled'] else 'false'}",
    ]
    return "\n".join(lines)


def as_json(request: dict[str, Any]) -> str:
    return json.dumps(request, indent=2)
