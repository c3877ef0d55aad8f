# Two entry points: `make demo` runs the kit on the bundled data, `make test` runs every test.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_WORKERS ?= 2

.PHONY: install demo test lint test-browser test-scale test-calibration bench clean server-vectors

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
	$(PY) -m pytest -n $(PYTEST_WORKERS) --timeout 900 -m "not calibration" tests

# the agent traces' provider calibration recomputed against docs/providers.md (issue 44; about 20 minutes on 2 cores)
test-calibration: install
	$(PY) -m pytest --timeout 3600 -m calibration tests

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
# (vLLM and SGLang from PyPI, about 9 GB), asks both about the kit's seeded corpus and about the outside request
# corpus, and writes what they answered to tests/data/servers/, the files named by the versions that ran
# (vllm-MAJOR.MINOR.*, sglang-MAJOR.MINOR.*). VLLM / SGLANG: the versions (defaults: the newest known here).
# MODEL_DIR: a Kimi-K2.5 checkpoint directory (or its tokenizer and config files) holding Moonshot's
# tokenization_kimi.py and tool_declaration_ts.py; the kit never runs that code. A requirement of the vLLM wheel
# that the index does not serve (vLLM 0.34.0 pins flashinfer-python==0.7.3) is skipped and named
# (tools/server_vectors/install_wheel.py); the render server runs with VLLM_TARGET_DEVICE=cpu CUDA_VISIBLE_DEVICES="".
SERVER_VENV ?= .server-venv
MODEL_DIR ?=
VLLM ?= 0.34.0
SGLANG ?= 0.5.23
REQUESTS_SEED ?= 0
REQUESTS_GENERATED ?= 2500
SERVER_VECTORS_OUT ?= tests/data/servers
SERVER_PY := $(SERVER_VENV)/bin/python
SERVER_PIP := $(SERVER_PY) -m pip install --progress-bar off --disable-pip-version-check
server-vectors: install
	@test -n "$(MODEL_DIR)" || { echo "usage: make server-vectors MODEL_DIR=DIR [VLLM=$(VLLM)] [SGLANG=$(SGLANG)] (DIR: a Kimi-K2.5 directory holding tokenization_kimi.py)"; exit 2; }
	@test -f "$(MODEL_DIR)/tokenization_kimi.py" || { echo "$(MODEL_DIR) holds no tokenization_kimi.py"; exit 2; }
	@echo "[server-vectors 1/6] environment $(SERVER_VENV)"
	test -x $(SERVER_PY) || python3 -m venv $(SERVER_VENV)
	$(SERVER_PIP) --upgrade pip
	@echo "[server-vectors 2/6] vllm==$(VLLM): its requirements the index serves, then the wheel --no-deps"
	$(SERVER_PY) -c 'import importlib.metadata as m, sys; sys.exit(m.version("vllm") != "$(VLLM)")' 2>/dev/null \
		|| $(SERVER_PY) tools/server_vectors/install_wheel.py vllm==$(VLLM) --skip-log $(SERVER_VENV)/vllm-skipped.txt
	@echo "[server-vectors 3/6] sglang==$(SGLANG) --no-deps and what its serving-chat path imports beyond vLLM's requirements"
	$(SERVER_PIP) --no-deps sglang==$(SGLANG)
	$(SERVER_PIP) -r tools/server_vectors/sglang-extras.txt
	@echo "[server-vectors 4/6] the corpora: the kit's seeded one and the outside requests"
	$(PY) tools/server_vectors/corpus.py --answers 3000 --prompts 640 --seed 0 -o $(SERVER_VENV)/corpus.jsonl
	$(PY) tools/server_vectors/outside_requests.py --seed $(REQUESTS_SEED) --generated $(REQUESTS_GENERATED) -o $(SERVER_VECTORS_OUT)/requests.corpus.jsonl.gz
	@echo "[server-vectors 5/6] vLLM's render server"
	$(SERVER_PY) tools/server_vectors/collect_vllm.py --model-dir $(MODEL_DIR) --corpus $(SERVER_VENV)/corpus.jsonl --requests $(SERVER_VECTORS_OUT)/requests.corpus.jsonl.gz --out $(SERVER_VECTORS_OUT)
	@echo "[server-vectors 6/6] SGLang's serving code in process"
	$(SERVER_PY) tools/server_vectors/collect_sglang.py --model-dir $(MODEL_DIR) --corpus $(SERVER_VENV)/corpus.jsonl --requests $(SERVER_VECTORS_OUT)/requests.corpus.jsonl.gz --out $(SERVER_VECTORS_OUT)
