# Every target sets up what it needs, so a fresh machine needs only `make serve` or `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
AGENTS := tools/agent-clis

.PHONY: venv agents serve test lint bench reference clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

$(AGENTS)/node_modules/.installed: $(AGENTS)/package.json $(AGENTS)/package-lock.json
	cd $(AGENTS) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

agents: $(AGENTS)/node_modules/.installed

# The pinned agent CLIs come first on PATH once `make test` or `make agents` installed them, so the
# in-process worker launches the same versions the tests ran.
serve: venv
	PATH="$(CURDIR)/$(AGENTS)/node_modules/.bin:$$PATH" $(VENV)/bin/amux serve

lint: venv
	$(PY) -m ruff check .
	$(PY) -m mypy

test: venv agents lint
	PATH="$(CURDIR)/$(AGENTS)/node_modules/.bin:$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest

bench: venv
	for script in tests/benchmarks/bench_*.py; do $(PY) $$script || exit 1; done

reference: venv
	$(PY) -m scripts.reference

clean:
	rm -rf $(VENV) $(AGENTS)/node_modules .mypy_cache .pytest_cache .ruff_cache
