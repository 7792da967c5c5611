# Development tasks for django-dynlock.  Needs only python3, node and npm.
#
#   make venv        .venv with the package (editable) and the dev extras
#   make node        node_modules with dynalite (a local DynamoDB server)
#   make browser     Debian's chromium for the admin's browser test (apt-get, as root)
#   make test        full test suite, then the Django 4.2 LTS pass (test-dj42)
#   make test-dj42   Django 4.2 LTS pass over the Django-facing tests (-m "not slow")
#   make run         demo site at http://127.0.0.1:8000/admin/ (admin/admin)
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
PY_DEPS := setup.cfg pyproject.toml
DYNALITE := node_modules/.bin/dynalite
CHROMIUM := /usr/bin/chromium
# The Django 4.2 pass runs what touches Django; the engine, the servers and the fault
# proxy do not depend on the Django version and run once, in the main pass.
DJANGO_LAYER_TESTS := tests/test_conf.py tests/test_checks_table.py tests/test_decorator.py \
	tests/test_fencing.py tests/test_testing_helpers.py tests/test_demo.py tests/test_migrations.py \
	tests/test_commands.py tests/test_singleton.py tests/test_admin.py tests/test_admin_browser.py

.PHONY: venv node browser test test-dj42 run clean

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

# The browser test (tests/test_admin_browser.py) drives Debian's chromium through
# Playwright; Playwright's own browser downloads are not used. Installed only when
# missing, and only as root (CI); otherwise the test is skipped (it fails under CI=true).
browser:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's chromium for the browser test"; \
		log=$$(mktemp); \
		if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >"$$log" 2>&1; then \
			tail -n 20 "$$log"; echo "warning: could not install chromium: the browser test cannot run"; \
		fi; \
		rm -f "$$log"; \
	else \
		echo "note: $(CHROMIUM) is missing (apt-get install chromium as root): the browser test will be skipped"; \
	fi

test: venv node browser
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-dj42

test-dj42: $(VENV_DJ42)/.installed node
	$(VENV_DJ42)/bin/python -c 'import django; assert django.VERSION[:2] == (4, 2), django.get_version(); print("Django", django.get_version())'
	$(VENV_DJ42)/bin/python -m pytest -m "not slow" $(DJANGO_LAYER_TESTS) $(PYTEST_ARGS)

run: venv
	$(VENV)/bin/python scripts/demo.py

clean:
	rm -rf $(VENV) $(VENV_DJ42) node_modules .demo
