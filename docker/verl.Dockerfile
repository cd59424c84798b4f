# verl-deploy images of upstream verl (docker/variants.yaml `runtimes: verl`): verl's own trainer,
# `python3 -m verl.trainer.main_ppo`, on the dependency set verl documents and tests (its `vllm` extra).
#
# Build with `verl-deploy images build --variant cu130 --runtime verl`. What it shares with docker/Dockerfile, the
# image of verl-deploy's runtime: the base image, the user and folders (build/base.sh), the compiler layer
# (build/toolchain.sh), the build's checks (preflight, verify, prune), HF_HOME on /cache, the NVIDIA_* settings and
# the labels. Not the torch layer: verl 0.9.1 pins torch 2.11.0, verl-deploy's cu130 image torch 2.14.0.
# The entrypoint puts the run's secret files (/run/secrets) where the libraries read them, then runs the command:
# `docker run IMAGE python3 -c "import verl; print(verl.__version__)"` is the tutorial's check.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---- base: the user and folders every image shares ------------------------------------------------------------
FROM ${BASE_IMAGE} AS base
COPY build/base.sh /tmp/
RUN sh /tmp/base.sh && rm /tmp/base.sh

# ---- deps: torch, then verl with its pins, into /opt/venv --------------------------------------------------------
FROM base AS deps
COPY extras/ /extras/
ENV PIP_CONFIG_FILE=/extras/pip.conf \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
COPY build/preflight.py /extras/build/
RUN python3 /extras/build/preflight.py /extras/pip.conf /extras/pip-torch.conf \
 && python3 -m venv /opt/venv && pip install "pip>=25.1" "setuptools>=68" wheel
ENV PIP_PROGRESS_BAR=raw

ARG VARIANT
ARG TORCH_VERSION
ARG CUDA=none
ARG COMPUTE_CAPABILITIES=
COPY build/verify.py /extras/build/
RUN PIP_CONFIG_FILE=/extras/pip-torch.conf pip install "torch==${TORCH_VERSION}" \
 && python /extras/build/verify.py torch

# The runtime's packages (verl[vllm]==0.9.1 and its pins), with torch and vLLM held at the catalog's; then the
# checks: every == pin installed as written, `import verl` gives the runtime's version, and verl's Hydra config
# composes (`main_ppo --cfg job`), so that an image that cannot start verl's trainer never gets a tag.
ARG VLLM_VERSION=
ARG RUNTIME_PACKAGES
ARG RUNTIME_VERSION
RUN set -f \
 && pip install "torch==${TORCH_VERSION}" ${VLLM_VERSION:+"vllm==${VLLM_VERSION}"} ${RUNTIME_PACKAGES} \
 && python /extras/build/verify.py deps \
 && cd /tmp && python /extras/build/verify.py verl

ARG UNUSED=
ARG ORPHANS=
ARG UNUSED_PATHS=
COPY build/prune.py /extras/build/
RUN python /extras/build/prune.py $(echo /opt/venv/lib/python3*/site-packages) \
 && cd /tmp && python /extras/build/verify.py verl

# ---- toolchain: Triton compiles its CUDA launcher with `cc` at first use -----------------------------------------
FROM base AS toolchain
ARG COMPILER=false
COPY build/toolchain.sh /tmp/
RUN COMPILER=$COMPILER sh /tmp/toolchain.sh && rm /tmp/toolchain.sh

# ---- runtime ---------------------------------------------------------------------------------------------------
FROM toolchain AS runtime
COPY --from=deps /opt/venv /opt/venv
# verl-deploy's secret-file loader (verl_runtime/secrets.py, standard library only) as the entrypoint.
COPY verl_runtime/secrets.py /opt/verl-deploy/secrets.py

ARG NVIDIA_VISIBLE_DEVICES=void
ARG NVIDIA_REQUIRE_CUDA=
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/cache/huggingface \
    VLLM_USE_FLASHINFER_SAMPLER=0 \
    NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES} \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA=${NVIDIA_REQUIRE_CUDA}

USER 1000:1000
WORKDIR /workspace
ENTRYPOINT ["python3", "/opt/verl-deploy/secrets.py"]
CMD ["python3", "-c", "import verl; print(verl.__version__)"]

ARG BASE_IMAGE
ARG VARIANT
ARG CUDA=none
ARG TORCH_VERSION
ARG VLLM_VERSION=
ARG COMPUTE_CAPABILITIES=
ARG RUNTIME=verl
ARG RUNTIME_VERSION
LABEL org.opencontainers.image.title="verl-deploy" \
      org.opencontainers.image.description="upstream verl ${RUNTIME_VERSION} (verl.trainer.main_ppo), variant ${VARIANT}" \
      org.opencontainers.image.version="${RUNTIME_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      verl-deploy.variant="${VARIANT}" \
      verl-deploy.cuda="${CUDA}" \
      verl-deploy.torch="${TORCH_VERSION}" \
      verl-deploy.vllm="${VLLM_VERSION}" \
      verl-deploy.compute-capabilities="${COMPUTE_CAPABILITIES}" \
      verl-deploy.runtime="${RUNTIME}" \
      verl-deploy.runtime-version="${RUNTIME_VERSION}"

# ---- runtime-with-ca: `--keep-ca-bundle` only. Processes in the container trust the build's CA bundle. ---------
FROM runtime AS runtime-with-ca
COPY --from=deps /extras/ca-bundle.pem /etc/verl-deploy/ca-bundle.pem
ENV SSL_CERT_FILE=/etc/verl-deploy/ca-bundle.pem \
    REQUESTS_CA_BUNDLE=/etc/verl-deploy/ca-bundle.pem \
    PIP_CERT=/etc/verl-deploy/ca-bundle.pem
