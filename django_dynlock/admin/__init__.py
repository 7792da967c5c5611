"""The "Leases" admin page (Django's autodiscover imports this package, which registers it).

- ``leases``: the ModelAdmin and its views (list, detail, break, the list's action);
- ``rows``: one lease as the templates show it;
- ``breaks``: breaking from the admin: the form, the admin log, the unconfirmed breaks;
- ``cursors``: the list's page cursor;
- ``notices``: a DynamoDB or settings failure as the page shows it.
"""

from .cursors import decode_cursor, encode_cursor
from .leases import LeaseAdmin
from .rows import Row, make_row

__all__ = ["LeaseAdmin", "Row", "decode_cursor", "encode_cursor", "make_row"]
