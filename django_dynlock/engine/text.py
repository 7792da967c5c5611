"""Text from outside (keys, holders, reasons) made safe for a terminal or a log line.

Keys are filled from URLs, holders record ``request.path``, break reasons are typed by
whoever runs ``breaklock``: any of them can carry an ESC sequence (which moves the
cursor, rewrites or hides what the operator reads before answering y), a bidi override
(which shows the text in another order), or a newline (which forges a log line).
"""

from __future__ import annotations

import re

# C0 and C1 controls, DEL, and the bidi controls (LRM/RLM, ALM, embeddings, overrides, isolates)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every control and bidi character written as its escape (``\\x1b``,
    ``\\n``, ``\\u202e``); everything else as it is."""
    return _UNSAFE.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), text)
