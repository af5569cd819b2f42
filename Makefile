# Entry points for people; CI runs .ci/run, which ends in `make test`.
VENV ?= .venv
PYTHON ?= python3

.PHONY: setup venv k8s node demo cluster test test-gpu bench ci

# Debian packages (runc, busybox-static, iproute2) installed with apt when
# missing, Python and Go checked; every target that runs containers needs it.
setup:
	PYTHON=$(PYTHON) scripts/setup-host.sh

# The venv is (re)installed when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# Build (cold ~7 min on 2 cores) or reuse the Kubernetes control-plane binaries.
k8s:
	scripts/build-k8s.sh

# Build (cold ~6 min on 2 cores) or reuse the real node: kubelet, containerd,
# CNI plugins, pause and busybox images.
node: setup
	scripts/build-node.sh

# The driver end to end on emulated GPUs: control plane, two emulated GPU nodes,
# example claims through the kubelet's DRA code, CDI and runc.
demo: setup venv
	$(VENV)/bin/dra-driver demo

# A real control plane in the foreground; prints the kubeconfig. Ctrl-C stops it.
cluster: venv
	$(VENV)/bin/dra-driver dev-cluster up

# The whole suite: ruff, mypy, import contracts, pytest (all tiers).
test: setup venv
	scripts/test

# Tier 5 on a real GPU node (root): not part of `test`, CI has no GPU.
test-gpu: venv
	PYTHON=$(VENV)/bin/python scripts/test-gpu

# Benchmarks (figures in docs/benchmarks.md); not tests, nothing asserts a time.
bench: setup venv
	DRA_K8S_BIN_DIR=$$(scripts/build-k8s.sh) sh -c 'for b in prepare_latency inventory_discovery plugin_prepare prepare_socket e2e_pod_start health_events claims_metrics dynamic_mig cel_engines simulate_throughput explain_latency share_prepare real_pod_start reference_plugin start_to_socket; do echo "== bench.$$b"; $(VENV)/bin/python -m bench.$$b || exit 1; done'

ci:
	.ci/run
