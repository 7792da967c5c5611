"""The "Leases" admin page: live leases read from DynamoDB, and breaking them safely.

There is no SQL table behind it. ``Lease`` is an unmanaged placeholder model that gives
the admin an entry and two permissions; every view here is our own:

- the list (``admin:django_dynlock_lease_changelist``): one Scan call per page, with a
  cursor (DynamoDB's ``LastEvaluatedKey``) for the next page, never one call per row;
- the detail page (``admin:django_dynlock_lease_change``, one consistent read);
- the confirmation page (``admin:django_dynlock_lease_break``): GET shows the lease and
  its token, POST (``token``, ``reason``) breaks it only if it still has that token.

``view_lease`` and ``break_lease`` are checked in every view, not only used to hide links.
Each break goes to the admin log (``LogEntry``) and sends ``lock_broken``. A DynamoDB
failure is shown on the page with what to do about it, never as a 500.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

import django
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.text import Truncator
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from .. import admin_ids, conf
from ..engine.breaking import MAX_REASON
from ..engine.client import LockClient
from ..engine.items import LeaseInfo
from ..exceptions import BreakUnconfirmed, DynLockError
from ..management import formatting as fmt
from ..models import Lease
from ..registry import get_lock_client
from .breaks import (
    break_lease,
    confirm_breaks,
    not_broken_message,
    parse_token,
    posted_reason,
    unconfirmed_message,
)
from .cursors import decode_cursor, encode_cursor
from .notices import FailureNotice, UnknownAlias, failure_notice
from .rows import Row, make_row, raw_json

#: The changelist action's name (also the ``action`` value its form posts).
BREAK_ACTION = "break_leases"
#: Most keys one bulk confirmation page reads (one GetItem each).
MAX_SELECTED = 100
#: The list's auto-refresh periods, in seconds (the ``refresh`` query parameter). Each
#: refresh is the page's one Scan, so none is shorter than a second.
REFRESH_CHOICES = (1, 2, 5, 10, 30, 60)
TEMPLATES = "admin/django_dynlock/lease"
#: Django 6.1's admin styles its breadcrumbs as ``<ol class="breadcrumbs">`` of ``<li>``
#: (the separators drawn by CSS), earlier ones as ``<div class="breadcrumbs">`` with
#: ``&rsaquo;`` between links: ``_base.html`` writes the one this Django styles.
BREADCRUMBS_LIST = django.VERSION >= (6, 1)
#: Longest key shown in the breadcrumbs (the page shows it whole).
CRUMB_KEY_CHARS = 80


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin):
    """Admin over the lock table of one or more ``DYNLOCK`` aliases."""

    list_per_page = 100
    actions = None  # ours is not a queryset action: see changelist_view / BREAK_ACTION

    # -- permissions ---------------------------------------------------------------
    def _perm(self, request: HttpRequest, codename: str) -> bool:
        user = request.user
        return bool(user.is_active and user.is_staff and user.has_perm(f"{self.opts.app_label}.{codename}"))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._perm(request, "view_lease")

    def has_break_permission(self, request: HttpRequest) -> bool:
        return self._perm(request, "view_lease") and self._perm(request, "break_lease")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _require_view(self, request: HttpRequest) -> None:
        if not self.has_view_permission(request):
            raise PermissionDenied

    def _require_break(self, request: HttpRequest) -> None:
        self._require_view(request)
        if not self.has_break_permission(request):
            raise PermissionDenied

    # -- URLs ------------------------------------------------------------------------
    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.changelist_view), name=f"{prefix}_changelist"),
            path("<path:object_id>/break/", wrap(self.break_view), name=f"{prefix}_break"),
            path("<path:object_id>/", wrap(self.detail_view), name=f"{prefix}_change"),
        ]

    def _url(self, name: str, *args: Any, alias: str | None = None, **query: Any) -> str:
        url = reverse(
            f"admin:{self.opts.app_label}_{self.opts.model_name}_{name}", args=args, current_app=self.admin_site.name
        )
        if alias and alias != conf.DEFAULT_ALIAS:
            query = {"alias": alias, **query}
        query = {k: v for k, v in query.items() if v not in (None, "", False)}
        return f"{url}?{urlencode(query)}" if query else url

    # The pages' links name the alias in the query string; the admin log's link, which
    # can only carry the object id, names it in the id (see admin_ids).
    def detail_url(self, key: str, alias: str) -> str:
        return self._url("change", quote(admin_ids.object_id(key)), alias=alias)

    def break_url(self, key: str, alias: str) -> str:
        return self._url("break", quote(admin_ids.object_id(key)), alias=alias)

    # -- shared ----------------------------------------------------------------------
    def _alias(self, request: HttpRequest, named: str | None = None) -> str:
        """The alias an object id names, else the one the form or query string names."""
        alias = named or request.POST.get("alias") or request.GET.get("alias") or ""
        configured = conf.aliases()
        if not alias:
            return conf.DEFAULT_ALIAS if conf.DEFAULT_ALIAS in configured or not configured else configured[0]
        if alias not in configured:
            raise UnknownAlias(
                _("DYNLOCK has no alias %(alias)r; configured: %(configured)s.")
                % {"alias": alias, "configured": ", ".join(map(repr, configured)) or _("none")}
            )
        return alias

    def _crumbs(self, alias: str, *after: tuple[str, str | None, bool]) -> list[dict[str, Any]]:
        """The breadcrumbs after Home and the app: "Leases" then ``after``'s (label, url, is a key)."""
        crumbs = [(_("Leases"), self._url("changelist", alias=alias) if after else None, False), *after]
        return [
            {"label": Truncator(label).chars(CRUMB_KEY_CHARS) if key else label, "url": url, "key": key}
            for label, url, key in crumbs
        ]

    def _context(self, request: HttpRequest, title: str, alias: str, **extra: Any) -> dict[str, Any]:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "title": title,
            "alias": alias,
            "aliases": conf.aliases(),
            "has_view_permission": self.has_view_permission(request),
            "has_break_permission": self.has_break_permission(request),
            "changelist_url": self._url("changelist", alias=alias),
            "max_reason": MAX_REASON,
            "breadcrumbs_list": BREADCRUMBS_LIST,
            "crumbs": self._crumbs(alias),
            **extra,
        }
        try:
            client: LockClient | None = get_lock_client(alias)
        except DynLockError:
            client = None
        if client is not None:
            # What is safe to show: never SESSION_OPTIONS, never user:password of the endpoint;
            # the region too, which decides which table this is.
            context["where"] = {
                "table": client.options.table_name,
                "endpoint": client.where(),
                "key_prefix": client.options.key_prefix,
            }
        return context

    def _render(
        self, request: HttpRequest, template: str, context: dict[str, Any], status: int = 200
    ) -> TemplateResponse:
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, [f"{TEMPLATES}/{template}", f"admin/django_dynlock/{template}"], context, status=status
        )

    def _rows(self, infos: Iterable[LeaseInfo], alias: str, now: dt.datetime) -> list[Row]:
        rows = []
        for info in infos:
            row = make_row(info, now)
            row.detail_url = self.detail_url(info.key, alias)
            row.break_url = self.break_url(info.key, alias)
            rows.append(row)
        return rows

    def _semaphores(self, rows: list[Row], alias: str) -> list[Row]:
        """A semaphore's holders on this page together, after the other leases, by slot,
        under a title: ``export:acme 3/5``, how many hold the key and its stored limit
        (three reads for each semaphore shown)."""
        groups: dict[str, list[Row]] = {}
        for row in rows:
            if fmt.semaphore(row.info) is not None:
                groups.setdefault(row.key, []).append(row)
        if not groups:
            return rows
        client = get_lock_client(alias)
        shown = [row for row in rows if fmt.semaphore(row.info) is None]
        for key in sorted(groups):
            members = sorted(groups[key], key=lambda row: fmt.slot(row.info) or 0)
            try:
                limit, held = client.semaphore_limit(key), len(client.holders(key))
            except DynLockError:
                limit, held = None, len(members)
            if limit is None:
                limit = fmt.semaphore(members[0].info)
            members[0].group = f"{key} {held}/{limit}"
            for row in members:
                row.slot = fmt.slot(row.info)
            shown.extend(members)
        return shown

    # -- the list ----------------------------------------------------------------------
    def _refresh(self, request: HttpRequest) -> int | None:
        """The auto-refresh period the query string asks for (None: off)."""
        value = request.GET.get("refresh", "")
        if not value:
            return None
        if value.isdigit() and int(value) in REFRESH_CHOICES:
            return int(value)
        messages.warning(
            request,
            _("Auto-refresh is off: %(value)r is not one of its periods (%(choices)s seconds).")
            % {"value": value, "choices": ", ".join(map(str, REFRESH_CHOICES))},
        )
        return None

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        self._require_view(request)
        if request.method == "POST":
            return self._action(request)
        confirm_breaks(request)
        query = request.GET.get("q", "")
        include_all = request.GET.get("all") == "1"
        refresh = self._refresh(request)
        cursor = request.GET.get("cursor", "")
        try:
            page_number = max(1, min(int(request.GET.get("p", "1")), 10**9))
        except ValueError:
            page_number = 1
        alias = conf.DEFAULT_ALIAS
        rows: list[Row] = []
        next_cursor: str | None = None
        hidden_expired = 0
        error: FailureNotice | None = None
        now = dt.datetime.now(dt.UTC)
        try:
            alias = self._alias(request)
            client = get_lock_client(alias)
            try:
                start = decode_cursor(cursor, client.options.key_attribute)
            except ValueError:
                messages.warning(request, _("That page link is not valid any more: showing the first page."))
                start, cursor, page_number = None, "", 1
            # The one DynamoDB call of this page.
            infos, last_key = client.scan_page(
                query, include_released=include_all, start=start, limit=self.list_per_page
            )
            next_cursor = encode_cursor(last_key, client.options.key_attribute)
            now = client.server_datetime()  # lease times are DynamoDB's clock
        except DynLockError as exc:
            error = failure_notice(exc, alias)
            infos = []
        if not include_all:
            live = [info for info in infos if fmt.state(info, now) != "expired"]
            hidden_expired = len(infos) - len(live)
            infos = live
        rows = self._rows(sorted(infos, key=lambda info: info.key), alias, now)
        if error is None:
            rows = self._semaphores(rows, alias)
        base = {"q": query, "all": "1" if include_all else "", "refresh": refresh}
        context = self._context(
            request,
            _("Leases"),
            alias,
            rows=rows,
            error=error,
            query=query,
            include_all=include_all,
            hidden_expired=hidden_expired,
            page_number=page_number,
            is_first_page=not cursor,
            first_page_url=self._url("changelist", alias=alias, **base),
            next_page_url=self._url("changelist", alias=alias, **base, cursor=next_cursor, p=page_number + 1)
            if next_cursor
            else None,
            toggle_all_url=self._url(
                "changelist", alias=alias, q=query, all="" if include_all else "1", refresh=refresh
            ),
            refresh=refresh,
            refresh_choices=REFRESH_CHOICES,
            break_action=BREAK_ACTION,
            now=now,
            **(extra_context or {}),
        )
        return self._render(request, "change_list.html", context)

    # -- the detail page ---------------------------------------------------------------
    def detail_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        self._require_view(request)
        confirm_breaks(request)
        key, named = admin_ids.parse(unquote(object_id))
        alias = conf.DEFAULT_ALIAS
        row: Row | None = None
        error: FailureNotice | None = None
        now = dt.datetime.now(dt.UTC)
        try:
            alias = self._alias(request, named)
            client = get_lock_client(alias)
            info = client.get(key, include_released=True)
            now = client.server_datetime()
        except DynLockError as exc:
            error, info = failure_notice(exc, alias), None
        raw = ""
        if info is not None:
            row = self._rows([info], alias, now)[0]
            raw = raw_json(info)
        context = self._context(
            request,
            _("Lease"),
            alias,
            key=key,
            row=row,
            raw=raw,
            error=error,
            now=now,
            break_url=self.break_url(key, alias),
            crumbs=self._crumbs(alias, (key, None, True)),
        )
        return self._render(request, "detail.html", context)

    # -- breaking ----------------------------------------------------------------------
    def break_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: the confirmation page. POST (token, reason): break if the token still matches."""
        self._require_break(request)
        if request.method != "POST":
            confirm_breaks(request)
        key, named = admin_ids.parse(unquote(object_id))
        alias = conf.DEFAULT_ALIAS
        status = 200
        form_errors: list[str] = []
        reason = ""
        posted_token: int | None = None
        error: FailureNotice | None = None
        info: LeaseInfo | None = None
        now = dt.datetime.now(dt.UTC)
        try:
            alias = self._alias(request, named)
            client = get_lock_client(alias)
            now = client.server_datetime()
            if request.method == "POST":
                posted_token = parse_token(request.POST.get("token"))
                reason, reason_error = posted_reason(request)
                if posted_token is None:
                    form_errors.append(_("The form has no valid token: reload the lease and try again."))
                if reason_error:
                    form_errors.append(reason_error)
                if posted_token is not None and not form_errors:
                    try:
                        if break_lease(request, client, alias, key, posted_token, reason):
                            messages.success(
                                request,
                                _("Broke the lease on %(key)r (token %(token)s).")
                                % {"key": key, "token": posted_token},
                            )
                            return HttpResponseRedirect(self._url("changelist", alias=alias))
                    except BreakUnconfirmed:
                        messages.warning(request, unconfirmed_message(key, posted_token))
                        return HttpResponseRedirect(self.detail_url(key, alias))
                    status = 409
                info = fmt.breakable(client, key)
                if status == 409:
                    messages.warning(request, not_broken_message(key, posted_token, info, now))
                else:
                    status = 400
            else:
                info = fmt.breakable(client, key)
        except UnknownAlias as exc:
            error, status = failure_notice(exc, alias), 400 if request.method == "POST" else 200
        except DynLockError as exc:
            error = failure_notice(exc, alias)
            if request.method == "POST":
                status = 503  # nothing was broken: DynamoDB could not be used
        context = self._context(
            request,
            _("Break a lease"),
            alias,
            key=key,
            row=self._rows([info], alias, now)[0] if info is not None else None,
            error=error,
            form_errors=form_errors,
            reason=reason,
            detail_url=self.detail_url(key, alias),
            form_url=self.break_url(key, alias),
            now=now,
            crumbs=self._crumbs(alias, (key, self.detail_url(key, alias), True), (_("Break"), None, False)),
        )
        return self._render(request, "break_confirmation.html", context, status=status)

    def _action(self, request: HttpRequest) -> HttpResponse:
        """The changelist's POST: the ``break_leases`` action on the selected keys.

        First POST (``_selected_action``): the confirmation page with each key's current
        token. Confirming POST (``post=yes``, ``key``/``token`` pairs, ``reason``): break
        each key that still has its token.
        """
        self._require_break(request)
        try:
            alias = self._alias(request)
        except UnknownAlias as exc:
            messages.error(request, str(exc))
            return HttpResponseRedirect(self._url("changelist"))
        back = self._url("changelist", alias=alias)
        if request.POST.get("action") != BREAK_ACTION:
            messages.warning(request, _("No action selected."))
            return HttpResponseRedirect(back)
        now = dt.datetime.now(dt.UTC)
        if request.POST.get("post") == "yes":
            return self._break_selected(request, alias, back, now)
        keys = list(dict.fromkeys(k for k in request.POST.getlist(ACTION_CHECKBOX_NAME) if k))
        if not keys:
            messages.warning(request, _("Select the leases to break: nothing was broken."))
            return HttpResponseRedirect(back)
        if len(keys) > MAX_SELECTED:
            messages.warning(
                request, _("Select at most %(count)s leases at a time: nothing was broken.") % {"count": MAX_SELECTED}
            )
            return HttpResponseRedirect(back)
        items: list[tuple[str, Row | None]] = []
        error = None
        try:
            client = get_lock_client(alias)
            now = client.server_datetime()
            for key in keys:
                info = fmt.breakable(client, key)
                items.append((key, self._rows([info], alias, now)[0] if info is not None else None))
        except DynLockError as exc:
            error = failure_notice(exc, alias)
        return self._render_selected(
            request,
            alias,
            items=items,
            error=error,
            form_errors=[],
            reason="",
            any_breakable=any(row is not None and row.breakable for _, row in items),
            now=now,
        )

    def _render_selected(self, request: HttpRequest, alias: str, status: int = 200, **extra: Any) -> TemplateResponse:
        """The list action's confirmation page (also with the errors of its form)."""
        crumbs = self._crumbs(alias, (_("Break leases"), None, False))
        context = self._context(request, _("Break leases"), alias, break_action=BREAK_ACTION, crumbs=crumbs, **extra)
        return self._render(request, "break_selected_confirmation.html", context, status=status)

    def _break_selected(self, request: HttpRequest, alias: str, back: str, now: dt.datetime) -> HttpResponse:
        keys = request.POST.getlist("key")
        tokens = [parse_token(t) for t in request.POST.getlist("token")]
        reason, reason_error = posted_reason(request)
        form_errors = [reason_error] if reason_error else []
        if len(keys) != len(tokens) or not keys or None in tokens or len(keys) > MAX_SELECTED:
            form_errors.append(_("The form must post one token for each key: select the leases again."))
        pairs = list(zip(keys, tokens))
        if form_errors:
            return self._render_selected(
                request, alias, status=400, error=None, form_errors=form_errors, reason=reason, now=now, posted=pairs
            )
        broken: list[str] = []
        try:
            client = get_lock_client(alias)
            for key, token in [(key, token) for key, token in pairs if token is not None]:  # all, once checked
                try:
                    if break_lease(request, client, alias, key, token, reason):
                        broken.append(key)
                        continue
                except BreakUnconfirmed:
                    messages.warning(request, unconfirmed_message(key, token))
                else:
                    # No extra read to say who has it now: the list shows that.
                    messages.warning(
                        request,
                        _(
                            "Not broken: the lease on %(key)r is no longer held with token %(token)s "
                            "(released or taken over since it was shown)."
                        )
                        % {"key": key, "token": token},
                    )
        except DynLockError as exc:
            found = failure_notice(exc, alias)
            messages.error(request, f"{found.message} {found.hint}")
        if broken:
            count = len(broken)
            messages.success(
                request,
                ngettext("Broke %(count)d lease: %(keys)s.", "Broke %(count)d leases: %(keys)s.", count)
                % {"count": count, "keys": ", ".join(map(repr, broken))},
            )
        return HttpResponseRedirect(back)
