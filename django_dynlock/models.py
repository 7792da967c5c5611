"""A placeholder model for the admin: leases live in DynamoDB, not in SQL.

``Lease`` is unmanaged (no table is ever created or queried). It exists so that the
admin has an entry for the app, and so that the two permissions below can be granted
to users and groups like any other.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class Lease(models.Model):
    """One lock key in the lock table (read from DynamoDB by the admin, never from SQL)."""

    key = models.CharField(_("key"), max_length=2048, primary_key=True)

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("view_lease", _("Can view leases")),
            ("break_lease", _("Can break leases")),
        ]
        verbose_name = _("lease")
        verbose_name_plural = _("leases")

    def __str__(self) -> str:
        return str(self.key)
