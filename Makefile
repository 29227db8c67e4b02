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

## The course's modules compiled once: a chapter or a grade starts hundreds of
## Pythons, and with PYTHONDONTWRITEBYTECODE set nothing else would ever write
## the bytecode, so each would compile its imports again.
COMPILE := $(BIN)/python -m compileall -q autograder handson

## book: execute every chapter and build the HTML site into _build/html
## (`make test` builds it first, so the tests find the bytecode too)
book: $(STAMP)
	$(COMPILE)
	$(BIN)/jupyter-book build . -W -n --keep-going

## test: build the book (the gate), then run the test suite
## Four test files at a time: most of a test is waiting on leases, kills and
## sleeps; the corpus run first (tests/conftest.py's FIRST, so not xdist's
## reorder). With REDIS_URL the tests share that server (and empty it), so one.
TEST_JOBS := $(if $(REDIS_URL),-n 0,-n 4 --dist loadfile --no-loadscope-reorder)
test: book
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest $(TEST_JOBS)

## exercises: regenerate exercises/ from solutions/ (never edit exercises/ by hand)
## From a clean copy holding only the source notebooks, so nothing a notebook
## wrote when it ran (myqueue.py, myoutbox.py, databases) reaches the release.
## Each assignment is recorded in $(GRADEBOOK), which `nbgrader autograde` reads.
RELEASE ?= $(CURDIR)/exercises
GRADEBOOK ?= $(CURDIR)/gradebook.db
exercises: $(STAMP)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	cp nbgrader_config.py "$$tmp/" && \
	for a in $$(ls solutions); do \
	  mkdir -p "$$tmp/solutions/$$a" && \
	  cp "solutions/$$a/$$a.ipynb" "$$tmp/solutions/$$a/" && \
	  (cd "$$tmp" && nbgrader generate_assignment $$a --force --log-level=ERROR \
	    --CourseDirectory.release_directory="$(abspath $(RELEASE))" \
	    --CourseDirectory.db_url="sqlite:///$(abspath $(GRADEBOOK))") || exit 1; \
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
