"""Sphinx configuration: the docs site (``make docs``, Read the Docs).

The pages are the Markdown files of docs/ (MyST keeps them readable on GitHub too); the
API reference is taken from the package's docstrings by autodoc, which imports the
package, so Django is configured first with the least the package's modules need.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import django  # noqa: E402
from django.conf import settings  # noqa: E402

if not settings.configured:
    settings.configure(
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django_dynlock",
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        USE_TZ=True,
    )
    django.setup()

import django_dynlock  # noqa: E402

project = "django-dynlock"
author = "the django-dynlock authors"
copyright = "django-dynlock authors, BSD-3-Clause"
release = django_dynlock.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# `file.md#a-heading` links resolve as on GitHub: anchors for headings down to ####,
# slugged the way GitHub slugs them.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]
# Code spans and fences stay as they are; only ```{directive} fences are Sphinx's.
myst_fence_as_directive: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_default_options: dict[str, object] = {}
# Types that are Any to the package (no hints) or internal aliases that autodoc cannot
# resolve to a documented page: nitpicky mode stays off, so they are shown as written.
nitpicky = False

html_theme = "furo"
html_title = f"django-dynlock {release}"
html_static_path: list[str] = []


def setup(app):  # type: ignore[no-untyped-def]
    # Pygments has no lexer for crontab lines; a shell's reads their comments and commands.
    from pygments.lexers.shell import BashLexer

    app.add_lexer("crontab", BashLexer)
