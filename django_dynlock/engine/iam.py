"""The IAM actions django-dynlock needs on its table, and least-privilege policies.

Two principals: the runtime one (web and worker processes, cron jobs under
``runlocked``, the operator commands ``showlocks`` and ``breaklock``, the admin), and the
deploy-time one (``createlocktable`` and ``check --deploy``). Both policies are scoped
to the table's ARN. docs/security.md prints them; ``createlocktable --print`` too, and
an AccessDenied error names the policy that holds the refused action.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Every request a lock, a lease's upkeep, a break and a listing make, as IAM actions.
#: IAM has no action for a transaction: AWS authorizes each entry of a TransactWriteItems
#: by its own action ("Using IAM with DynamoDB transactions", DynamoDB Developer Guide),
#: so acquire_many's transaction of Update entries needs UpdateItem, and the
#: ConditionCheck of lease.condition_check() (docs/decorator.md's fencing for data in
#: DynamoDB) needs ConditionCheckItem on the lock table. BatchGetItem reads acquire_many's
#: tokens back; Scan serves the admin's list and showlocks. No table-level action: a
#: runtime principal cannot create, alter or describe the table.
RUNTIME_ACTIONS: tuple[str, ...] = (
    "dynamodb:GetItem",
    "dynamodb:UpdateItem",
    "dynamodb:BatchGetItem",
    "dynamodb:ConditionCheckItem",
    "dynamodb:Scan",
)

#: Operations that IAM authorizes by their entries' actions, not by one of their own.
TRANSACTIONS = frozenset({"TransactWriteItems", "TransactGetItems"})

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


def refused_action(operation: str | None, message: str) -> str | None:
    """The IAM action an AccessDenied refused: the one AWS's text names, else the
    operation's own; None for a transaction whose text names none (its entries each have
    their own action)."""
    match = _REFUSED.search(message)
    if match:
        return match.group(1)
    if operation is None or operation in TRANSACTIONS:
        return None
    return f"dynamodb:{operation}"


_REFUSED = re.compile(r"not authorized to perform: (dynamodb:[A-Za-z]+)")


def policies_with(action: str | None) -> list[str]:
    """The policies that grant an action (DescribeTable: both); the runtime one for an
    action of neither."""
    return [which for which, actions in POLICIES.items() if action in actions] or ["runtime"]
