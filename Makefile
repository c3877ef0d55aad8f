# Two entry points: `make demo` runs the kit on the bundled data, `make test` runs every test.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_WORKERS ?= 2

.PHONY: install demo test lint test-browser test-scale bench clean server-vectors

# the install prints a line per stage and pip's line per package (no -q: a cold install takes minutes, never silently)
PIP_INSTALL := $(PY) -m pip install --progress-bar off --disable-pip-version-check
$(STAMP): pyproject.toml requirements-interop.txt
	@echo "[install 1/5] virtual environment $(VENV)"
	test -x $(PY) || python3 -m venv $(VENV)
	@echo "[install 2/5] pip"
	$(PIP_INSTALL) --upgrade pip
	@echo "[install 3/5] kimi-eagle and its dependencies (a cold install fetches about 170 packages, a line each: a few minutes)"
	$(PIP_INSTALL) -e '.[dev,interop,scale]'
	@echo "[install 4/5] the GPU trainers' packages, without their dependencies (requirements-interop.txt)"
	$(PIP_INSTALL) --no-deps -r requirements-interop.txt
	@echo "[install 5/5] the notebook kernel \"Python 3 (kimi-eagle)\""
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (kimi-eagle)"
	touch $(STAMP)
	@echo "[install] done"

install: $(STAMP)

demo: install
	$(PY) -m kimi_eagle demo -o runs/demo

lint: install
	$(PY) -m ruff check kimi_eagle tests bench tools

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

# The real servers as the reference (never part of `make test`; docs/servers.md): builds a separate environment
# (vLLM 0.33.0 and SGLang 0.5.23 from PyPI, about 10 GB), asks both about the seeded corpus and writes their
# answers and prompts to tests/data/servers/. MODEL_DIR: a Kimi-K2.5 checkpoint directory (or its tokenizer
# files) holding Moonshot's tokenization_kimi.py and tool_declaration_ts.py; the kit never runs that code.
SERVER_VENV ?= .server-venv
MODEL_DIR ?=
SERVER_VECTORS_OUT ?= tests/data/servers
server-vectors: install
	@test -n "$(MODEL_DIR)" || { echo "usage: make server-vectors MODEL_DIR=DIR (a Kimi-K2.5 directory holding tokenization_kimi.py)"; exit 2; }
	@test -f "$(MODEL_DIR)/tokenization_kimi.py" || { echo "$(MODEL_DIR) holds no tokenization_kimi.py"; exit 2; }
	test -x $(SERVER_VENV)/bin/python || python3 -m venv $(SERVER_VENV)
	$(SERVER_VENV)/bin/pip install -q vllm==0.33.0
	$(SERVER_VENV)/bin/pip install -q --no-deps sglang==0.5.23
	$(SERVER_VENV)/bin/pip install -q -r tools/server_vectors/sglang-extras.txt
	$(PY) tools/server_vectors/corpus.py --answers 3000 --prompts 640 --seed 0 -o $(SERVER_VENV)/corpus.jsonl
	$(SERVER_VENV)/bin/python tools/server_vectors/collect_vllm.py --model-dir $(MODEL_DIR) --corpus $(SERVER_VENV)/corpus.jsonl --out $(SERVER_VECTORS_OUT)
	$(SERVER_VENV)/bin/python tools/server_vectors/collect_sglang.py --model-dir $(MODEL_DIR) --corpus $(SERVER_VENV)/corpus.jsonl --out $(SERVER_VECTORS_OUT)
