# verl-deploy's services image: the run's tool services (verl_runtime/services/: the code sandbox, the retriever)
# and nothing else: no torch, no CUDA, no trainer dependencies. What a sandbox or retriever container or pod runs
# (services.image defaults to it); numpy stays, because the code that tools run uses it.
#
# Build with `verl-deploy images build --variant services` (tag <repository>:<version>-services): the same context,
# base, user, folders and labels as the runtime images (docker/Dockerfile), with the project's `services` extra in
# place of its runtime. Size: docs/images.md.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS base
COPY build/base.sh /tmp/
RUN sh /tmp/base.sh && rm /tmp/base.sh

# ---- deps: the services extra alone into /opt/venv (build-only inputs in /extras, never in the runtime stage) ---
FROM base AS deps
COPY extras/ /extras/
ENV PIP_CONFIG_FILE=/extras/pip.conf \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
COPY build/preflight.py /extras/build/
RUN python3 /extras/build/preflight.py /extras/pip.conf /extras/pip.conf \
 && python3 -m venv /opt/venv && pip install "pip>=25.1" "setuptools>=68" wheel
ENV PIP_PROGRESS_BAR=raw

# The extra's requirements as pyproject.toml lists them (not the project's own dependencies: the host CLI's
# typer, docker, kubernetes, matplotlib are no service's), with the project's pins; rebuilt only when these change.
WORKDIR /src
COPY pyproject.toml ./
COPY installer/constraints.txt ./installer/
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['services']))" > /tmp/services.txt \
 && pip install -c installer/constraints.txt -r /tmp/services.txt \
 && rm /tmp/services.txt

# ---- project: the source, without its dependencies ------------------------------------------------------------
COPY verl_runtime/ ./verl_runtime/
COPY installer/verl_deploy/ ./installer/verl_deploy/
COPY build/verify.py /extras/build/
RUN touch README.md \
 && pip install --no-deps --no-build-isolation . \
 && rm -rf /opt/venv/lib/python3*/site-packages/verl_deploy /opt/venv/bin/verl-deploy \
 && pip uninstall -y -q setuptools wheel \
 && find /opt/venv -name __pycache__ -prune -exec rm -rf {} + \
 && cd / && rm -rf /src \
 && python /extras/build/verify.py services

# ---- runtime ---------------------------------------------------------------------------------------------------
FROM base AS runtime
COPY --from=deps /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=void
USER 1000:1000
WORKDIR /workspace
ENTRYPOINT ["python"]
CMD ["-m", "verl_runtime.services.sandbox", "--help"]

ARG BASE_IMAGE
ARG VARIANT=services
ARG RUNTIME_VERSION
ARG RUNTIME_SOURCE=
LABEL org.opencontainers.image.title="verl-deploy" \
      org.opencontainers.image.description="verl-deploy's tool services: the code sandbox and the retriever (variant ${VARIANT})" \
      org.opencontainers.image.version="${RUNTIME_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      verl-deploy.variant="${VARIANT}" \
      verl-deploy.cuda="none" \
      verl-deploy.torch="" \
      verl-deploy.vllm="" \
      verl-deploy.compute-capabilities="" \
      verl-deploy.runtime="verl-deploy" \
      verl-deploy.runtime-version="${RUNTIME_VERSION}" \
      verl-deploy.runtime-source="${RUNTIME_SOURCE}"

# ---- runtime-with-ca: `--keep-ca-bundle` only ------------------------------------------------------------------
FROM runtime AS runtime-with-ca
COPY --from=deps /extras/ca-bundle.pem /etc/verl-deploy/ca-bundle.pem
ENV SSL_CERT_FILE=/etc/verl-deploy/ca-bundle.pem \
    REQUESTS_CA_BUNDLE=/etc/verl-deploy/ca-bundle.pem \
    PIP_CERT=/etc/verl-deploy/ca-bundle.pem
