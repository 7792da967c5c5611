# Development tasks for django-dynlock.  Needs only python3, node and npm.
#
#   make venv        .venv with the package (editable) and the dev extras
#   make node        node_modules with dynalite (a local DynamoDB server)
#   make test        full test suite, then the Django 4.2 LTS pass (test-dj42)
#   make test-dj42   Django 4.2 LTS compatibility pass (-m "not slow")
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

.PHONY: venv node test test-dj42 run clean

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

test: venv node
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-dj42

test-dj42: $(VENV_DJ42)/.installed node
	$(VENV_DJ42)/bin/python -c 'import django; assert django.VERSION[:2] == (4, 2), django.get_version(); print("Django", django.get_version())'
	$(VENV_DJ42)/bin/python -m pytest -m "not slow" $(PYTEST_ARGS)

run: venv
	$(VENV)/bin/python scripts/demo.py

clean:
	rm -rf $(VENV) $(VENV_DJ42) node_modules .demo
