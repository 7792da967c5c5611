"""Lock-table items the library did not write, or that were edited by hand (issue 14)."""

from __future__ import annotations

# Items the library did not write, or that were edited by hand (issue 14): each must show
# as a row that says what is wrong with it, never as a 500 or a traceback.
MALFORMED_ITEMS = {
    "foreign:1": {"data": {"S": "written by another application"}},
    "bad:expires": {
        "owner": {"S": "o1"},
        "fence": {"N": "5"},
        "expires_at": {"N": "1E+20"},
        "lease_ms": {"N": "10000"},
    },
    "bad:fence": {"owner": {"S": "o2"}, "fence": {"N": "1.5"}, "expires_at": {"N": "1800000000"}},
    "bad:binary": {
        "owner": {"B": b"\x00\x01"},
        "fence": {"N": "7"},
        "holder": {"B": b"\xff"},
        "host": {"B": b"h"},
        "expires_at": {"N": "1800000000"},
    },
    "bad:types": {
        "owner": {"S": "o3"},
        "fence": {"S": "seven"},
        "expires_at": {"S": "soon"},
        "pid": {"N": "2.5"},
        "holder": {"M": {"view": {"N": "1"}, "tags": {"SS": ["a", "b"]}}},
        "lease_ms": {"N": "1E+30"},
        "acquired_at": {"N": "-1E+20"},
    },
}


def put_malformed_items(boto, table: str, key_attribute: str = "key", prefix: str = "") -> list[str]:
    """Write MALFORMED_ITEMS into ``table`` with a raw boto3 client; returns their keys."""
    for key, attributes in MALFORMED_ITEMS.items():
        boto.put_item(TableName=table, Item={key_attribute: {"S": prefix + key}, **attributes})
    return sorted(MALFORMED_ITEMS)
