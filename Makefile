# Every command a user needs. `make train` and `make test` create .venv on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed-requirements

.PHONY: help venv ffmpeg train sweep test test-all test-fast slurm-or-skip bench bench-replay-service results play compare lint slurm-up slurm-down clean

help: ## Every target, one line each
	@awk -F ':.*## ' '/^[a-z-]+:.*## / {printf "  make %-22s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

venv: $(INSTALLED)

# Reinstall whenever the pins change.
$(INSTALLED): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --requirement requirements.txt
	cp requirements.txt $(INSTALLED)

# torchcodec (TorchRL's MP4 writer) loads FFmpeg's shared libraries, a system package.
ffmpeg: ## FFmpeg's libraries for MP4 videos (Debian's ffmpeg when missing, as root; else MP4 tests skip)
	@/sbin/ldconfig -p | grep -q libavcodec || \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ffmpeg; \
		else echo "FFmpeg's libraries are missing and installing them needs root" \
			"(sudo make ffmpeg): the tests that write MP4 videos skip (fail when CI is set)"; fi

train: venv ## Train SAC on Pendulum-v1 with configs/default.yaml; ARGS="key=value ..." overrides
	$(PY) train.py $(ARGS)

sweep: venv ## A hyperparameter sweep: SWEEP=<sweep file> (again: continues it; ARGS="--summary")
	$(PY) -m rl_app.sweep $(SWEEP) $(ARGS)

# Test processes (pytest-xdist). `make test` runs two: the SLURM tests one after the other in
# one, the Ray and RPC tests in the other, the rest wherever one is free (tests/conftest.py); TEST_JOBS=0
# runs everything in this process. The quick subset runs one process per core.
TEST_JOBS ?= 2
FAST_JOBS ?= auto
PYTEST := $(PY) -m pytest -rs --durations=15 --dist loadgroup

test: venv ffmpeg slurm-or-skip ## The suite, learning checks included (its time on 2 cores: docs/testing.md)
	$(PYTEST) -n $(TEST_JOBS) $(PYTEST_ARGS)

test-all: venv ffmpeg slurm-or-skip ## The suite plus the full-length learning checks (before releasing results)
	$(PYTEST) -n $(TEST_JOBS) -m "" $(PYTEST_ARGS)

test-fast: venv ffmpeg ## Everything but the learning checks and the SLURM cluster tests
	$(PY) -m pytest -m "not slow and not slurm and not release" -n $(FAST_JOBS) \
		--dist loadgroup $(PYTEST_ARGS)

slurm-or-skip:
	@$(MAKE) --no-print-directory slurm-up || \
		echo "local SLURM cluster not started (reason above): slurm tests skip (fail when CI is set)"

bench: venv ## Speed, side by side with Stable-Baselines3 (docs/speed.md), written to the run directory
	$(PY) -m tools.bench $(ARGS)

bench-replay-service: venv ## The replay buffer in-process vs the Ray replay service: frames/s, batches/s, ratios
	$(PY) -m tools.bench --only replay_service $(ARGS)

# Hours on a CPU. It names the committed files it rewrites before it starts.
results: venv ## The README table's presets over their seeds; rewrites docs/results.json, docs/results.png, README.md's table
	$(PY) -m tools.results $(ARGS)

play: venv ## Play a run's best checkpoint: RUN=runs/<run>, ARGS="--video out.mp4 --episodes 3 ..."
	$(PY) -m rl_app.play $(RUN) $(ARGS)

compare: venv ## Compare runs: RUNS="runs/a runs/b ...", OUT=dir (default: a new runs/compare-*)
	$(PY) -m rl_app.compare $(RUNS) $(if $(OUT),--out $(OUT))

slurm-up: ## Start the local one-node SLURM cluster (root; installs its Debian packages if missing)
	bash slurm/local-cluster/up.sh

slurm-down: ## Stop the local SLURM cluster: its jobs, then the daemons slurm-up started
	bash slurm/local-cluster/down.sh

lint: venv ## ruff: lint and format check
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean: ## Delete runs/ and pytest's cache
	rm -rf runs .pytest_cache
