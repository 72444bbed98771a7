# trainwave — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CACHE ?= $(HOME)/.cache/trainwave
VENV ?= $(CACHE)/venv-py311
PY := $(VENV)/bin/python
BIN := $(CACHE)/bin
export PATH := $(VENV)/bin:$(BIN):$(PATH)
export TRAINWAVE_CACHE := $(CACHE)
# This checkout's code first: the cached virtualenv is shared, and its editable install
# points at whichever checkout last installed it.
export PYTHONPATH := $(CURDIR)/operator$(if $(PYTHONPATH),:$(PYTHONPATH))
CLUSTER := $(PY) -m cluster
PYTEST := $(PY) -m pytest
# import every test module of a session, print only the last lines (the errors, or the count)
COLLECT = set -o pipefail; $(PYTEST) --collect-only -q -p no:cacheprovider $(1) 2>&1 | tail -n 25

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.stamp: pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

.PHONY: venv
venv: $(VENV)/.stamp ## create or refresh the cached virtualenv (outside the repo)

.PHONY: tools
tools: ## install or build the pinned tools into the cache: control plane, kwok, Kueue, the real node (kubelet, kube-proxy, containerd, CNI, crictl, CoreDNS), dashboard schema types (cold: ~20 min on 2 idle cores, warm: instant)
	tests/cluster/install-tools.sh all

# Stdlib only, so the system python3 will do: no virtualenv needed. See docs/images.md.
.PHONY: images
images: ## build the operator, agent, runtime images and their Debian bookworm base with buildah into the cache, as archives for containerd (root; cold ~5 min, warm <1 s, a source change ~1 min; docs/images.md)
	python3 hack/images.py

.PHONY: images-check
images-check: ## import the built images into a throwaway containerd and run each once (user 65532, read-only root)
	python3 hack/images_check.py

.PHONY: cluster-up
cluster-up: venv tools ## start the local control plane with the small simulated GPU topology
	cd tests && $(CLUSTER) up --topology cluster/topologies/small.yaml

.PHONY: cluster-down
cluster-down: venv ## stop the local control plane and remove its state
	cd tests && $(CLUSTER) down

.PHONY: generate
generate: venv ## regenerate CRDs, chart CRDs, values.schema.json, the dashboard, docs/reference and the kubelet gRPC stubs from their sources
	PYTHONPATH=operator $(PY) -m trainwave.api.generate --crds crds --chart charts/trainwave  # this tree's models
	$(PY) hack/values_schema.py charts/trainwave/values.yaml > charts/trainwave/values.schema.json
	PYTHONPATH=operator $(PY) hack/dashboard.py > charts/trainwave/dashboards/trainwave.json
	PYTHONPATH=operator $(PY) hack/reference.py docs/reference  # field and values reference
	$(PY) hack/protos.py operator/trainwave/agent/kubelet/gen  # kubelet gRPC stubs from k8s.io/kubelet's .proto files

.PHONY: check-generated
check-generated: generate ## fail if generated files differ from what is committed
	@git diff --exit-code -- crds charts/trainwave/templates/crds charts/trainwave/values.schema.json \
	  charts/trainwave/dashboards docs/reference operator/trainwave/agent/kubelet/gen \
	  || { echo "generated files drifted: run 'make generate' and commit"; exit 1; }

.PHONY: lint
lint: venv ## ruff, mypy (strict on the pure packages and the controller), import-linter, yamllint, helm lint, every test module collects
	$(PY) -m ruff check operator tests hack
	$(PY) -m ruff format --check operator tests hack
	$(PY) -m mypy
	PYTHONPATH=operator $(VENV)/bin/lint-imports  # this tree, whatever the venv was installed from
	$(PY) -m yamllint -s .
	tests/cluster/install-tools.sh kubectl-helm
	$(BIN)/helm lint --strict charts/trainwave
	# every test module imports, in the sessions `make test` runs: a moved helper fails here, in seconds
	$(call COLLECT,tests/unit tests/host tests/integration)
	$(call COLLECT,tests/e2e)
	$(call COLLECT,tests/chaos)

.PHONY: fmt
fmt: venv ## format the code
	$(PY) -m ruff format operator tests hack
	$(PY) -m ruff check --fix operator tests hack

# The spec fuzz draws 2,000 examples in `make test` (its default); `make unit`, the quick
# loop, draws UNIT_FUZZ_EXAMPLES of the same derandomized sequence.
UNIT_FUZZ_EXAMPLES ?= 300
# `make unit` runs in UNIT_WORKERS pytest-xdist processes (0: one process, no xdist). The
# unit tests are independent of each other.
UNIT_WORKERS ?= 2
# Integration (and `make test`'s first session) runs in INTEGRATION_WORKERS pytest-xdist
# processes, a test file each at a time, each worker with a control plane, chart and operator
# of its own (tests/integration/conftest.py): the tests mostly wait on the cluster (serially,
# the 2 cores were a third busy), so two streams overlap: 908 -> 527-579 s for the session at
# load ~1. 0: one process on the shared cluster.
INTEGRATION_WORKERS ?= 2
PARALLEL = -n $(INTEGRATION_WORKERS) --dist loadfile

.PHONY: unit
unit: venv ## in-process unit tests, no cluster, in 2 processes (tests/unit; docs/development.md)
	TRAINWAVE_FUZZ_EXAMPLES=$(UNIT_FUZZ_EXAMPLES) $(PYTEST) -n $(UNIT_WORKERS) tests/unit

.PHONY: host
host: venv ## tests that run programs here, no cluster: helm and tsc on the chart, torch process groups, the launcher, the arbiter (tests/host)
	$(PYTEST) tests/host

.PHONY: integration
integration: venv tools ## integration tests against the real local control plane, in 2 processes with a cluster each
	$(PYTEST) $(PARALLEL) tests/integration

.PHONY: e2e
e2e: venv tools images ## end-to-end: the chart installed on the local cluster's real node, real training in containers (root; docs/e2e.md)
	flock /tmp/realnode.lock $(PYTEST) tests/e2e  # one cluster with real nodes per machine: wait for any other

.PHONY: chaos
chaos: venv tools ## seeded faults (operator kills, API server/kwok restarts, node loss and NotReady, evictions) while 54 jobs run; CHAOS_SEED=n picks another schedule
	$(PYTEST) tests/chaos

# Each tier that starts trainwave (integration, e2e, chaos) runs in a pytest session of its
# own: tests/conftest.py refuses a session holding two of them, which would start two
# operators; unit and host start none and share integration's session (one collection).
# e2e needs the images: it installs the chart on the real node (docs/e2e.md).
# Each session ends with its slowest tests (setup, call and teardown apart), so a CI log
# says where `make test`'s minutes went; DURATIONS= turns it off.
DURATIONS ?= --durations=25
# e2e (the real node) and chaos (kwok nodes) run beside each other, chaos on a control plane
# of its own (CHAOS_CLUSTER_DIR): both mostly wait on their clusters (side by side in a warm
# .ci/run: e2e 533 s, chaos 287 s; one after the other in the one before: 489 and 265 s).
# Chaos's output goes to a file, printed once e2e is done, so the two logs do not interleave;
# its figures go to the cache (CHAOS_RESULTS), not over the tracked results of `make chaos`.
CHAOS_CLUSTER_DIR ?= $(or $(TRAINWAVE_CLUSTER_DIR),$(CACHE)/cluster)-chaos
.PHONY: test
test: venv tools images check-generated ## all tests: generated-file drift, unit + host + integration (kwok, 2 processes), then e2e (real node, built images) beside chaos
	$(PYTEST) $(PARALLEL) $(DURATIONS) tests/unit tests/host tests/integration
	log=$$(mktemp -t trainwave-chaos.XXXXXX); \
	TRAINWAVE_CLUSTER_DIR=$(CHAOS_CLUSTER_DIR) CHAOS_RESULTS=$(CACHE)/chaos-last.json \
	  $(PYTEST) $(DURATIONS) tests/chaos >"$$log" 2>&1 & chaos=$$!; \
	trap 'kill $$chaos 2>/dev/null' INT TERM; \
	flock /tmp/realnode.lock $(PYTEST) $(DURATIONS) tests/e2e; e2e=$$?; \
	wait $$chaos; status=$$?; \
	echo "=== tests/chaos, run beside e2e (exit $$status) ==="; cat "$$log"; rm -f "$$log"; \
	exit $$(( e2e || status ))

.PHONY: demo
demo: venv tools images ## the main job: cluster with a real node, chart from its registry, the operator in-cluster, every example to its terminal state (root)
	$(PY) hack/demo.py

.PHONY: bench
bench: venv tools ## benchmarks, each on its own local cluster (see README, Performance)
	$(PY) tests/benchmarks/bench_apply_to_running.py
	$(PY) tests/benchmarks/bench_placement_vs_scheduler.py
	$(PY) tests/benchmarks/bench_constraints.py
	$(PY) tests/benchmarks/bench_scale.py

.PHONY: bench-scale-xlarge
bench-scale-xlarge: venv tools ## 2,000 jobs x 4 workers on 4,096 nodes against as many bare pods, same run: apply to all Running, per-job p99, operator RSS and CPU per job (15-30 min)
	BENCH_TOPOLOGY=xlarge $(PY) tests/benchmarks/bench_scale.py

.PHONY: bench-round-path
bench-round-path: venv tools ## the operator's placement path for one gang on 1,024 and 4,096 nodes, no cluster (~2 min; BENCH_ROUND_COMPARE=<rev> runs that revision alternately in the same run)
	$(PY) tests/benchmarks/bench_round_path.py

.PHONY: bench-pod-webhook
bench-pod-webhook: venv tools ## 500 jobs outside Kueue on 1,024 nodes, same run: no pod webhook, past Kueue's with a dry run, and behind the gate (~7 min)
	$(PY) tests/benchmarks/bench_pod_webhook.py

.PHONY: bench-saturation
bench-saturation: venv tools ## a full cluster fed a seeded stream of gangs: hand-off lag, utilisation while gangs wait, waits by size (64 nodes, ~4 min; BENCH_SATURATION=large for 1,024; BENCH_PEER=kueue adds Kueue's side, ~7.5 min)
	$(PY) tests/benchmarks/bench_saturation.py

.PHONY: bench-dns
bench-dns: venv tools images ## diagnostic: how long a name asked before its EndpointSlice stays unresolvable (CoreDNS's negative cache; root, the real node, ~4 min)
	flock /tmp/realnode.lock $(PY) tests/benchmarks/dns_negative_cache.py

.PHONY: bench-crd-cost
bench-crd-cost: venv tools ## diagnostic: kube-apiserver CPU per TrainingJob status patch, by CRD schema variant (~5 min)
	$(PY) tests/benchmarks/crd_write_cost.py

.PHONY: bench-pod-cost
bench-pod-cost: venv tools ## diagnostic: kube-apiserver CPU per worker pod written, server-side apply against create
	$(PY) tests/benchmarks/pod_write_cost.py

.PHONY: bench-faults
bench-faults: venv tools images ## faults on the real node (kill, SIGSTOP, slowed rank, a worker evicted): in-place repair vs gang recreation, same seeded schedule (root; ~15 min)
	flock /tmp/realnode.lock $(PY) tests/benchmarks/bench_faults.py

.PHONY: bench-replace
bench-replace: venv tools images ## one worker evicted on the real node: replaced alone vs gang recreation, alternating 3 rounds (root; ~15 min)
	flock /tmp/realnode.lock $(PY) tests/benchmarks/bench_replace.py

.PHONY: bench-comm
bench-comm: venv ## gradient communication on two emulated nodes (root: netns + tc; ~10 min)
	$(PY) tests/benchmarks/bench_comm.py
