"""Translations: the admin page, the model's names, the checks and the commands in French
(the locale the package ships), and the shipped catalogue complete and compiled.

Every translated string comes from django_dynlock/locale/fr (made with makemessages,
docs/admin.md "Translations"); the tests switch the language the Django ways a project
would: LANGUAGE_CODE, or LocaleMiddleware and the browser's Accept-Language.
"""

from __future__ import annotations

import ast
import gettext
import html
import os
import re
import shutil
import subprocess
import sys
import uuid
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.core import checks
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from django.utils import translation

from django_dynlock.models import Lease
from tests.support.tables import fresh_table
from tests.support.tools import missing_tool

LOCALE = Path(__file__).resolve().parent.parent / "django_dynlock" / "locale"
PO = LOCALE / "fr" / "LC_MESSAGES" / "django.po"
MO = LOCALE / "fr" / "LC_MESSAGES" / "django.mo"
LOCALE_MIDDLEWARE = "django.middleware.locale.LocaleMiddleware"


# -- the catalogue ------------------------------------------------------------------------------
def read_po(path: Path) -> dict[tuple[str, str | None], list[str]]:
    """(msgid, msgid_plural) -> its msgstr forms, read from a .po file; fuzzy or obsolete
    entries fail the test (gettext would not use them)."""
    entries: dict[tuple[str, str | None], list[str]] = {}
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        fields: dict[str, str] = {}
        field = ""
        for line in block.splitlines():
            assert not line.startswith("#~"), f"obsolete entry in {path.name}: {block}"
            if line.startswith("#,"):
                assert "fuzzy" not in line, f"fuzzy entry in {path.name}: {block}"
            elif line.startswith(("msgctxt", "msgid", "msgstr")):
                field, text = line.split(" ", 1)
                fields[field] = ast.literal_eval(text)
            elif line.startswith('"'):
                fields[field] += ast.literal_eval(line)
        if fields.get("msgid"):  # the header's msgid is empty
            forms = [fields[name] for name in sorted(fields) if name.startswith("msgstr")]
            # With a context, the id as the .mo stores it (what pgettext looks up).
            msgid = f"{fields['msgctxt']}\x04{fields['msgid']}" if "msgctxt" in fields else fields["msgid"]
            entries[(msgid, fields.get("msgid_plural"))] = forms
    return entries


def test_the_french_catalogue_is_complete_and_compiled():
    entries = read_po(PO)
    assert len(entries) > 200
    untranslated = [msgid for (msgid, _), forms in entries.items() if not forms or not all(forms)]
    assert not untranslated
    # The .mo the package ships is this .po compiled: every message, the same text.
    with MO.open("rb") as mo:
        catalogue = gettext.GNUTranslations(mo)
    for (msgid, plural), forms in entries.items():
        if plural is None:
            assert catalogue.gettext(msgid) == forms[0], msgid
        else:
            assert [catalogue.ngettext(msgid, plural, n) for n in (1, 2)] == forms, msgid


def test_makemessages_finds_nothing_the_catalogue_lacks(tmp_path):
    """The committed .po holds exactly what makemessages collects from today's source."""
    if shutil.which("xgettext") is None:
        missing_tool("makemessages needs GNU gettext: run `make gettext` (apt-get install gettext, as root)")
    package = tmp_path / "django_dynlock"
    shutil.copytree(PO.parents[3], package, ignore=shutil.ignore_patterns("__pycache__"))
    made = subprocess.run(
        [sys.executable, "-m", "django", "makemessages", "-l", "fr", "--no-location", "--no-obsolete"],
        cwd=package,
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    collected = read_po(package / "locale" / "fr" / "LC_MESSAGES" / "django.po")
    assert set(collected) == set(read_po(PO))


# -- the admin page -----------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def no_language_left_active():
    """LocaleMiddleware activates the request's language in the thread that serves it, and
    the test client serves in this one: without this, the tests after these run in French."""
    yield
    translation.deactivate()


@pytest.fixture
def table(moto_server, settings):
    with fresh_table(settings, moto_server.endpoint_url) as client:
        yield client


@pytest.fixture
def operator(django_user_model) -> Client:
    user = django_user_model.objects.create_user(f"u-{uuid.uuid4().hex[:8]}", password="pw", is_staff=True)
    for codename in ("view_lease", "break_lease"):
        user.user_permissions.add(Permission.objects.get(content_type__app_label="django_dynlock", codename=codename))
    browser = Client()
    browser.force_login(user)
    return browser


def in_french(settings, how: str) -> dict[str, str]:
    """Switch to French the way a project does; the headers for the test client's requests."""
    if how == "LANGUAGE_CODE":
        settings.LANGUAGE_CODE = "fr"
        return {}
    middleware = list(settings.MIDDLEWARE)
    middleware.insert(middleware.index("django.contrib.sessions.middleware.SessionMiddleware") + 1, LOCALE_MIDDLEWARE)
    settings.MIDDLEWARE = middleware
    return {"HTTP_ACCEPT_LANGUAGE": "fr-FR,fr;q=0.9,en;q=0.5"}


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["LANGUAGE_CODE", "Accept-Language"])
def test_the_admin_pages_render_in_french(table, operator, settings, how):
    headers = in_french(settings, how)
    lease = table.acquire("facture:42", lease=30, holder={"view": "shop.views.pay", "user": "42"})
    changelist = reverse("admin:django_dynlock_lease_changelist")

    page = operator.get(changelist, **headers)
    assert page.status_code == 200
    if headers:
        assert page["Content-Language"] == "fr"  # LocaleMiddleware chose it from the header
    text = page.content.decode()
    for french in (
        "<title>Baux |",  # the page title (the model's verbose_name_plural)
        "Verrous DynamoDB",  # the app's verbose_name, in the breadcrumbs
        "Accueil",
        "<span>Clé</span>",
        "<span>Détenteur</span>",
        "<span>Jeton</span>",
        "<span>Acquis</span>",
        "<span>Temps restant</span>",
        "<span>État</span>",
        ">détenu</span>",  # the state, shown translated; its code stays in the markup
        'data-state="held"',
        "utilisateur 42",
        "il y a ",
        "Page 1 : 1 bail.",
        "Fin de la table.",
        "Rompre les baux sélectionnés",
        'placeholder="Préfixe de clé"',
        "Inclure les libérés et les expirés",
        "Actualisation automatique :",
        '<option value="" selected>désactivée</option>',  # "off", with its context
        '<option value="1">toutes les secondes</option>',
        '<option value="5">toutes les 5 secondes</option>',
        'data-paused="Actualisation automatique en pause tant que des baux sont sélectionnés."',
        'data-failed="La liste n\'a pas pu être actualisée : rechargez la page."',
    ):
        assert french in text, french
    for english in ("<span>Holder</span>", "Time left", "End of the table.", "Break selected leases", " ago<"):
        assert english not in text, english

    detail = operator.get(reverse("admin:django_dynlock_lease_change", args=("facture:42",)), **headers)
    text = detail.content.decode()
    for french in ("Rompre ce bail", "Élément brut", "Durée du bail", "(horloge de DynamoDB)", "Retour aux baux"):
        assert french in text, french

    confirm = operator.get(reverse("admin:django_dynlock_lease_break", args=("facture:42",)), **headers)
    text = confirm.content.decode()
    assert f"Oui, rompre le jeton {lease.token}" in text and "Non, revenir à la page précédente" in text
    assert "Raison :" in text and "Son détenteur perd le bail" in text
    assert "Rompre n'arrête pas le détenteur" in html.unescape(text)  # the running view's 500 (issue 35)

    # A message from the view itself (gettext in admin/breaks.py), after a form error.
    refused = operator.post(
        reverse("admin:django_dynlock_lease_break", args=("facture:42",)),
        {"token": str(lease.token), "reason": ""},
        **headers,
    )
    assert refused.status_code == 400 and "Donnez une raison" in refused.content.decode()
    assert table.get("facture:42").token == lease.token  # nothing was broken
    lease.release()


@pytest.mark.django_db
def test_the_model_and_the_permissions_are_named_in_french():
    with translation.override("fr"):
        assert str(Lease._meta.verbose_name) == "bail" and str(Lease._meta.verbose_name_plural) == "baux"
        assert str(Lease._meta.get_field("key").verbose_name) == "clé"
        assert dict((code, str(name)) for code, name in Lease._meta.permissions) == {
            "view_lease": "Peut voir les baux",
            "break_lease": "Peut rompre les baux",
        }
    with translation.override("en"):
        assert str(Lease._meta.verbose_name_plural) == "leases"


# -- checks and commands ------------------------------------------------------------------------
def test_the_setting_checks_speak_the_language_they_are_shown_in(settings):
    settings.DYNLOCK = {"default": {"TABLE_NAME": "x", "LEASE_DURATIN": 30}}
    with translation.override("en"):
        english = [str(message) for message in checks.run_checks(tags=["dynlock"])]
    # The problems are cached once found; their text is chosen when shown.
    with translation.override("fr"):
        found = checks.run_checks(tags=["dynlock"])
        french = {message.id: (str(message.msg), str(message.hint)) for message in found}
    assert any("is not a django-dynlock setting" in line for line in english)
    assert french["dynlock.E004"] == (
        "DYNLOCK['default']['LEASE_DURATIN'] n'est pas un réglage de django-dynlock.",
        "Vouliez-vous dire 'LEASE_DURATION' ?",
    )
    assert (
        french["dynlock.E008"][0] == "DYNLOCK['default']['TABLE_NAME'] 'x' n'est pas un nom de table DynamoDB valable."
    )


def test_the_commands_speak_french(mock_dynlock):
    out, err = StringIO(), StringIO()
    with translation.override("fr"):
        call_command("showlocks", stdout=out, stderr=err)
        assert "Aucun bail actif dans la table" in out.getvalue()
        mock_dynlock.acquire("cron:nuit", lease=30)
        out = StringIO()
        call_command("runlocked", "cron:nuit", "--", "check", stdout=out, stderr=err)
        assert "Ignoré : le verrou 'cron:nuit' est occupé (jeton " in out.getvalue()
        with pytest.raises(CommandError) as refused:
            call_command("breaklock", "a", "b", "--token", "3", "--noinput", stdout=out, stderr=err)
        assert "--token s'applique à une seule KEY" in str(refused.value)


@pytest.mark.django_db
def test_an_elections_badge_and_w005_speak_french(table, operator, settings):
    """issue 37: the election's badge and its term's age on the list, and the beat check."""
    in_french(settings, "LANGUAGE_CODE")
    term = table.election("beat", lease=30).campaign(wait=5)
    text = operator.get(reverse("admin:django_dynlock_lease_changelist")).content.decode()
    assert '<span class="dynlock-badge">élection beat</span>' in text
    assert re.search(r'<div class="dynlock-term quiet">mandat depuis [0-9.]+s</div>', text)
    term.release()
    settings.CELERY_BEAT_SCHEDULER = "django_dynlock.celery.LeaderScheduler"
    settings.CELERY_DYNLOCK_BEAT_LEASE = 9
    settings.CELERY_BEAT_MAX_LOOP_INTERVAL = 10
    with translation.override("fr"):
        [found] = [m for m in checks.run_checks(tags=["dynlock"]) if m.id == "dynlock.W005"]
        said = (str(found.msg), str(found.hint))
    assert said[0].startswith("Celery beat avec django_dynlock.celery.LeaderScheduler peut dormir 10s")
    assert said[1] == "Réglez beat_max_loop_interval (CELERY_BEAT_MAX_LOOP_INTERVAL) à 3 ou moins, ou allongez le bail."
