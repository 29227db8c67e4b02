# Every target makes .venv (if missing) and installs into it first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: book test lint bench exercises clean

$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "installing the course's packages into $(VENV) (first time: about a minute)"
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	@touch $(STAMP)

## book: execute every chapter and build the HTML site into _build/html
book: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going

## test: build the book (the gate), then run the test suite
test: book
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest

## exercises: regenerate exercises/ from solutions/ (never edit exercises/ by hand)
exercises: $(STAMP)
	@for a in $$(ls solutions); do \
	  $(BIN)/nbgrader generate_assignment $$a \
	    --force --no-db --log-level=WARN || exit 1; \
	done

## bench: no-op jobs through the reference queue, RQ, Celery, huey, dramatiq
bench: $(STAMP)
	$(BIN)/python -m pip install -q -r requirements.txt \
	  -r handson/bench/requirements-bench.txt
	$(BIN)/python -m handson.bench --repeat 3

lint: $(STAMP)
	$(BIN)/python -m ruff check .

clean:
	rm -rf _build
