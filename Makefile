# Two commands do all the set-up: `make run` (the service on SQLite + local tiers)
# and `make test` (the whole suite, SQLite and PostgreSQL).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test screenshots soak lint format bench bench-register bench-sweep bench-transfer bench-client bench-integrations bench-imports bench-backtest clean

# The service and its client (a distribution of its own, client/), both editable.
$(STAMP): pyproject.toml client/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e ./client
	touch $(STAMP)

run: $(STAMP)
	CKPT_AUTH=$${CKPT_AUTH:-off} $(BIN)/ckpt serve

# The training frameworks' environment is built once per machine, outside the clone.
test: $(STAMP)
	bash tests/console/chromium.sh
	CKPT_FRAMEWORKS_PYTHON="$$(bash tests/frameworks/env.sh)" $(BIN)/pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=40

# The console's pictures in docs/console/, taken by its browser tests (on SQLite).
screenshots: $(STAMP)
	bash tests/console/chromium.sh
	CKPT_CONSOLE_SCREENSHOTS=docs/console $(BIN)/pytest -p no:xdist tests/console/test_screenshots.py -k sqlite

# Two schedulers and four workers on PostgreSQL over 50,000 actions (`make test` runs 2,000).
soak: $(STAMP)
	CKPT_TEST_CONCURRENCY_RUNS=$${CKPT_TEST_CONCURRENCY_RUNS:-5000} CKPT_TEST_REQUIRE_POSTGRES=true \
		$(BIN)/pytest -p no:xdist tests/reliability/test_many_processes.py

# client/ is checked by its own ruff settings (Python 3.10) and by mypy twice: with the rest,
# and as Python 3.10, the oldest it supports (3.11-only names would pass the first).
lint: $(STAMP)
	$(BIN)/ruff check app tests bench client
	$(BIN)/ruff format --check app tests bench client
	$(BIN)/mypy
	$(BIN)/mypy --python-version 3.10 client/src tests/client/fresh_probe.py
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff format app tests bench client
	$(BIN)/ruff check --fix app tests bench client

bench: bench-register bench-sweep bench-transfer bench-client bench-integrations bench-imports bench-backtest

bench-register: $(STAMP)
	$(BIN)/python bench/register.py

bench-sweep: $(STAMP)
	$(BIN)/python bench/sweep.py

bench-transfer: $(STAMP)
	$(BIN)/python bench/transfer.py

bench-client: $(STAMP)
	$(BIN)/python bench/client.py

bench-integrations: $(STAMP)
	$(BIN)/python bench/integrations.py

bench-imports: $(STAMP)
	$(BIN)/python bench/imports.py

bench-backtest: $(STAMP)
	$(BIN)/python bench/backtest.py

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
