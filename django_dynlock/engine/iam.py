"""The IAM actions django-dynlock needs on its table, and least-privilege policies.

Two principals: the runtime one (web and worker processes, cron jobs under
``runlocked``, the operator commands ``showlocks`` and ``breaklock``, the admin), and the
deploy-time one (``createlocktable`` and ``check --deploy``). Both policies are scoped
to the table's ARN. docs/security.md prints them; ``createlocktable --print`` too, and
an AccessDenied error names the policy that holds the refused action.
"""

from __future__ import annotations

import json
from typing import Any

#: Every request a lock, a lease's upkeep, a break and a listing make.
#: TransactWriteItems and BatchGetItem serve acquire_many; Scan the admin's list and
#: showlocks. No table-level action: a runtime principal cannot create, alter or
#: describe the table.
RUNTIME_ACTIONS: tuple[str, ...] = (
    "dynamodb:GetItem",
    "dynamodb:UpdateItem",
    "dynamodb:BatchGetItem",
    "dynamodb:TransactWriteItems",
    "dynamodb:Scan",
)

#: createlocktable (create, enable TTL, wait until ACTIVE) and the deployment checks.
DEPLOY_ACTIONS: tuple[str, ...] = (
    "dynamodb:CreateTable",
    "dynamodb:UpdateTimeToLive",
    "dynamodb:DescribeTable",
    "dynamodb:DescribeTimeToLive",
)

POLICIES = {"runtime": RUNTIME_ACTIONS, "deploy": DEPLOY_ACTIONS}


def table_arn(table: str, region: str | None, account: str | None = None) -> str:
    """The table's ARN; ``*`` for a region or account left unknown."""
    partition = "aws-cn" if (region or "").startswith("cn-") else "aws-us-gov" if "-gov-" in (region or "") else "aws"
    return f"arn:{partition}:dynamodb:{region or '*'}:{account or '*'}:table/{table}"


def policy(which: str, table: str, region: str | None, account: str | None = None) -> dict[str, Any]:
    """The IAM policy document (``which``: ``runtime`` or ``deploy``) for one table."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": f"DynLock{which.capitalize()}",
                "Effect": "Allow",
                "Action": list(POLICIES[which]),
                "Resource": table_arn(table, region, account),
            }
        ],
    }


def policy_json(which: str, table: str, region: str | None, account: str | None = None) -> str:
    return json.dumps(policy(which, table, region, account), indent=2)


def policies_with(operation: str | None) -> list[str]:
    """The policies that grant an operation's action (DescribeTable: both); the runtime
    one for an operation of neither."""
    action = f"dynamodb:{operation}"
    return [which for which, actions in POLICIES.items() if action in actions] or ["runtime"]
