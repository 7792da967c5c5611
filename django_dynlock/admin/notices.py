"""How a DynamoDB or settings failure is shown on the admin's pages: what happened and
what to do about it, never a 500."""

from __future__ import annotations

from dataclasses import dataclass

from django.utils.translation import gettext as _

from .. import conf
from ..exceptions import ConfigurationError, CredentialsError, DynLockError, TableNotFound


class UnknownAlias(DynLockError):
    pass


@dataclass
class FailureNotice:
    """A DynamoDB/settings failure, as shown on the page: what happened and what to do."""

    message: str
    hint: str


def failure_notice(exc: DynLockError, alias: str) -> FailureNotice:
    """What to tell an operator. Messages of the library never contain credentials."""
    switch = f" --alias {alias}" if alias != conf.DEFAULT_ALIAS else ""
    # The library's own messages (str(exc)) come from the engine, which imports nothing
    # from Django: they stay in English; the hints, what to do, are translated.
    if isinstance(exc, UnknownAlias):
        return FailureNotice(str(exc), _("Pick one of the configured aliases."))
    if isinstance(exc, ConfigurationError):
        # Its text may quote a setting's value (a mistyped SESSION_OPTIONS, say): not shown.
        return FailureNotice(
            _("The DYNLOCK setting of alias %(alias)r has errors.") % {"alias": alias},
            _("Run `python manage.py check` to see them, and fix DYNLOCK."),
        )
    if isinstance(exc, TableNotFound):
        # The admin's pages show no part of the keys (docs/security.md), not even the id.
        text = str(exc)
        if exc.access_key_id:
            text = text.replace(f"access key id {exc.access_key_id!r}", "an access key id not shown here")
        return FailureNotice(
            text, _("Create the table: `%(command)s`.") % {"command": f"python manage.py createlocktable{switch}"}
        )
    if isinstance(exc, CredentialsError):
        return FailureNotice(
            str(exc),
            _(
                "Check the credentials this server runs with (DYNLOCK SESSION_OPTIONS, "
                "AWS_* environment variables, profile or instance role)."
            ),
        )
    if getattr(exc, "code", None) == "AccessDeniedException":
        return FailureNotice(str(exc), _("Grant the IAM principal this server runs as those actions on the table."))
    return FailureNotice(
        str(exc),
        _(
            "Check that DynamoDB is reachable from this server and that ENDPOINT_URL and "
            "REGION_NAME are right: `python manage.py check --deploy --tag dynlock_table` "
            "tests the connection."
        ),
    )
