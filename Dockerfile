# Image of the DRA kubelet plugin (deploy/chart runs it as a DaemonSet).
#
#   docker build -t dra-driver:0.1.0 .
#
# Stage 1 builds the wheel; stage 2 installs only the wheel and its runtime
# dependencies, so the image holds no sources, tests or build tools.
#
# Root: the plugin runs as root (UID 0) on purpose. It must create its sockets
# in the kubelet's root-owned /var/lib/kubelet/plugins_registry and plugins/
# dirs, write CDI specs to /var/run/cdi, open /dev/nvidia* and run nvidia-smi
# and nvidia-cuda-mps-control, all of which need root on a node. The image
# still defines an unprivileged user (UID 65532) for the one-shot commands
# (`discover --emulate`, `slices`), e.g. `docker run --user 65532 ...`.
ARG PYTHON_IMAGE=python:3.11-slim
ARG GO_IMAGE=golang:1.26-bookworm

# NVIDIA's nvidia-cdi-hook, built from the toolkit's Go module pinned in cdi/hook by the
# same script the tests use (cgo on; it links only libc). Every CDI spec the plugin
# writes names it; the plugin copies it onto the host at start (README "What a
# container gets").
FROM ${GO_IMAGE} AS hook
WORKDIR /src
COPY cdi/hook ./cdi/hook
COPY scripts/build-cdi-hook.sh ./scripts/
RUN cp "$(DRA_DRIVER_CACHE=/tmp/cache scripts/build-cdi-hook.sh)" /nvidia-cdi-hook

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
RUN pip install --no-cache-dir "build>=1.2"
COPY pyproject.toml README.md ./
COPY dra_driver ./dra_driver
RUN python -m build --wheel --outdir /wheels .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="dra-driver" \
      org.opencontainers.image.description="Kubernetes DRA kubelet plugin for NVIDIA GPUs" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
# Optimized bytecode (-OO: no docstrings, no asserts) for everything the plugin
# loads, and PYTHONOPTIMIZE=2 to use it: 1.5 MB less resident memory at rest on
# every node (README "Benchmarks"). Compiled here, so no start compiles it;
# test files are never imported and some do not compile.
RUN pip install /wheels/*.whl && rm -rf /wheels \
 && python -OO -m compileall -q -j 0 -x '/(tests?|idle_test|lib2to3)/' /usr/local/lib/python3.11 \
 && useradd --system --uid 65532 --no-create-home --shell /usr/sbin/nologin dra
ENV PYTHONOPTIMIZE=2
# NVML (libnvidia-ml.so.1) comes from the host's driver root, mounted by the
# chart at /driver-root; the entry point exposes that one library to the loader
# (not the host's whole lib dir, which would shadow the image's libc).
COPY --from=hook /nvidia-cdi-hook /usr/local/bin/nvidia-cdi-hook
COPY deploy/image/entrypoint.sh /usr/local/bin/dra-driver-entrypoint
ENTRYPOINT ["dra-driver-entrypoint"]
CMD ["kubelet-plugin"]
