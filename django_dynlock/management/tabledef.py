"""The lock table as requests and as CloudFormation, for ``createlocktable --print``.

Must describe the same table as ``engine.table.create_table``: partition key only
(``KEY_ATTRIBUTE``, a string) and TTL on ``TTL_ATTRIBUTE``. The tests create a
table from this output (API requests and a CloudFormation stack on moto) and run
leases on it, so a drift between the two shows up there.
"""

from __future__ import annotations

import json
from typing import Any

from ..engine.options import ClientOptions


def create_table_request(
    options: ClientOptions, billing_mode: str, read: int | None, write: int | None
) -> dict[str, Any]:
    """CreateTable parameters, also valid for ``aws dynamodb create-table --cli-input-json``."""
    request: dict[str, Any] = {
        "TableName": options.table_name,
        "KeySchema": [{"AttributeName": options.key_attribute, "KeyType": "HASH"}],
        "AttributeDefinitions": [{"AttributeName": options.key_attribute, "AttributeType": "S"}],
        "BillingMode": billing_mode,
    }
    if billing_mode == "PROVISIONED":
        request["ProvisionedThroughput"] = {"ReadCapacityUnits": read, "WriteCapacityUnits": write}
    return request


def ttl_request(options: ClientOptions) -> dict[str, Any]:
    """UpdateTimeToLive parameters (``aws dynamodb update-time-to-live --cli-input-json``)."""
    return {
        "TableName": options.table_name,
        "TimeToLiveSpecification": {"Enabled": True, "AttributeName": options.ttl_attribute},
    }


def _q(value: str) -> str:
    # A JSON string is a valid double-quoted YAML scalar: names such as "on" or
    # "yes" stay strings instead of turning into booleans.
    return json.dumps(value)


def cloudformation(options: ClientOptions, billing_mode: str, read: int | None, write: int | None) -> str:
    """A CloudFormation (YAML) ``Resources`` block with the table and its TTL."""
    lines = [
        "Resources:",
        "  DynLockTable:",
        "    Type: AWS::DynamoDB::Table",
        # Keep the table when the stack goes: deleting it would drop every live lease.
        "    DeletionPolicy: Retain",
        "    UpdateReplacePolicy: Retain",
        "    Properties:",
        f"      TableName: {_q(options.table_name)}",
        f"      BillingMode: {billing_mode}",
        "      AttributeDefinitions:",
        f"        - AttributeName: {_q(options.key_attribute)}",
        "          AttributeType: S",
        "      KeySchema:",
        f"        - AttributeName: {_q(options.key_attribute)}",
        "          KeyType: HASH",
    ]
    if billing_mode == "PROVISIONED":
        lines += [
            "      ProvisionedThroughput:",
            f"        ReadCapacityUnits: {read}",
            f"        WriteCapacityUnits: {write}",
        ]
    lines += [
        "      TimeToLiveSpecification:",
        f"        AttributeName: {_q(options.ttl_attribute)}",
        "        Enabled: true",
    ]
    return "\n".join(lines)


def as_json(request: dict[str, Any]) -> str:
    return json.dumps(request, indent=2)
