# Two entry points: `make demo` runs the kit on the bundled data, `make test` runs every test.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_WORKERS ?= 2

.PHONY: install demo test lint test-browser test-scale bench clean

$(STAMP): pyproject.toml requirements-interop.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,interop,scale]'
	$(PY) -m pip install -q --no-deps -r requirements-interop.txt
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (kimi-eagle)"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) -m kimi_eagle demo -o runs/demo

lint: install
	$(PY) -m ruff check kimi_eagle tests bench

# the real-browser test (tests/test_browser.py) runs whenever /usr/bin/chromium exists and skips itself otherwise
test: install lint
	$(PY) -m pytest -n $(PYTEST_WORKERS) --timeout 900 tests

test-browser: install
	$(PY) -m pytest --timeout 600 -m browser tests

# reconstruct_batch in the scale-out engines alone: datasets.map (2 processes) and Ray Data on a local Ray (part of `make test` too)
test-scale: install
	$(PY) -m pytest --timeout 600 tests/test_reconstruct_batch.py tests/test_ray_data.py

# the timing benchmarks; the end-to-end measurement (bench/e2e_stories.py, ~30 min) is run on its own
bench: install
	for b in encode reconstruct diff collect extract train_step export_data; do echo "== bench/$$b.py"; $(PY) bench/$$b.py || exit 1; done

clean:
	rm -rf runs .pytest_cache
