# epdbench images. Build from the repository root:
#   docker build --target runner -t REGISTRY/epdbench:0.1.0 .         # load generator Jobs, flows in the cluster
#   docker build --target router -t REGISTRY/epdbench-router:0.1.0 .  # vllm-router baked in (air-gapped clusters)
# then push both and set target.kubernetes.runner_image and target.kubernetes.router.image (with
# router.pip_install: null) in the spec. The base is pinned by version; pin it by digest too
# (python:3.11.11-slim-bookworm@sha256:…) where your registry policy asks for it.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# --- build: the package and its pinned dependencies into a virtual environment --------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/epdbench
WORKDIR /src
COPY pyproject.toml README.md ./
COPY epdbench/ epdbench/
COPY physics/ physics/
COPY specs/ specs/
COPY analysis/ analysis/
COPY reports/ reports/
COPY sim/ sim/
COPY manifests/ manifests/
COPY tasks/ tasks/
COPY flows/ flows/
RUN /opt/epdbench/bin/pip install --no-compile "setuptools==80.9.0" \
 && /opt/epdbench/bin/pip install --no-compile --no-build-isolation . \
 && /opt/epdbench/bin/pip uninstall -y setuptools

# --- runner: `epdbench` (load generator Jobs, Prefect work-pool jobs); no build tools, non-root ---------
FROM ${PYTHON_IMAGE} AS runner
COPY --from=build /opt/epdbench /opt/epdbench
RUN groupadd --gid 10001 epdbench && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin epdbench
ENV PATH=/opt/epdbench/bin:$PATH PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 PREFECT_HOME=/tmp/prefect MPLCONFIGDIR=/tmp/mpl
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["epdbench"]
CMD ["--help"]

# --- router: vllm-router only, installed at build time instead of at pod start ---------------------------
FROM ${PYTHON_IMAGE} AS router
RUN python -m venv /opt/router && /opt/router/bin/pip install --no-cache-dir --no-compile "vllm-router==0.1.17" \
 && groupadd --gid 10001 router && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin router
ENV PATH=/opt/router/bin:$PATH
USER 10001:10001
ENTRYPOINT ["vllm-router"]
