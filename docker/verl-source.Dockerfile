# verl-deploy images of the user's own verl (`verl-deploy images build --runtime verl --verl-source SRC`): a fork,
# or a repository that vendors verl beside its scripts and recipes (installer/verl_deploy/verl_source.py).
#
# The same base, user and folders (build/base.sh), compiler layer (build/toolchain.sh), checks (preflight, verify,
# prune), entrypoint and labels as docker/verl.Dockerfile. The layers: the dependencies the source declares, keyed
# by the pins chosen for it (TORCH_VERSION, VLLM_VERSION, RUNTIME_PACKAGES: the build args, so Docker's cache keeps
# them while the declarations stay the same), then the source itself, COPY'd last: an edit of the source rebuilds
# that layer and the check after it only. The source is on PYTHONPATH, owned by root and read-only to the trainer.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---- base: the user and folders every image shares ------------------------------------------------------------
FROM ${BASE_IMAGE} AS base
COPY build/base.sh /tmp/
RUN sh /tmp/base.sh && rm /tmp/base.sh

# ---- deps: torch, then what the source declares, into /opt/venv --------------------------------------------------
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

ARG VLLM_VERSION=
ARG RUNTIME_PACKAGES
ARG RUNTIME=verl
RUN set -f \
 && pip install "torch==${TORCH_VERSION}" ${VLLM_VERSION:+"vllm==${VLLM_VERSION}"} ${RUNTIME_PACKAGES} \
 && python /extras/build/verify.py deps

ARG UNUSED=
ARG ORPHANS=
ARG UNUSED_PATHS=
COPY build/prune.py /extras/build/
RUN python /extras/build/prune.py $(echo /opt/venv/lib/python3*/site-packages)

# ---- toolchain: Triton compiles its CUDA launcher with `cc` at first use -----------------------------------------
FROM base AS toolchain
ARG COMPILER=false
COPY build/toolchain.sh /tmp/
RUN COMPILER=$COMPILER sh /tmp/toolchain.sh && rm /tmp/toolchain.sh

# ---- runtime ---------------------------------------------------------------------------------------------------
FROM toolchain AS runtime
COPY --from=deps /opt/venv /opt/venv
COPY verl_runtime/secrets.py /opt/verl-deploy/secrets.py
COPY build/verify.py /opt/verl-deploy/verify.py

ARG NVIDIA_VISIBLE_DEVICES=void
ARG NVIDIA_REQUIRE_CUDA=
ARG SOURCE_PYTHONPATH=/opt/verl-source
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=${SOURCE_PYTHONPATH} \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/cache/huggingface \
    VLLM_USE_FLASHINFER_SAMPLER=0 \
    NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES} \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA=${NVIDIA_REQUIRE_CUDA}

ARG BASE_IMAGE
ARG VARIANT
ARG CUDA=none
ARG TORCH_VERSION
ARG VLLM_VERSION=
ARG TRANSFORMERS_VERSION=
ARG COMPUTE_CAPABILITIES=
ARG RUNTIME=verl
LABEL org.opencontainers.image.title="verl-deploy" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      verl-deploy.variant="${VARIANT}" \
      verl-deploy.cuda="${CUDA}" \
      verl-deploy.torch="${TORCH_VERSION}" \
      verl-deploy.vllm="${VLLM_VERSION}" \
      verl-deploy.transformers="${TRANSFORMERS_VERSION}" \
      verl-deploy.compute-capabilities="${COMPUTE_CAPABILITIES}" \
      verl-deploy.runtime="${RUNTIME}"

# The source, last. Its labels change with it (commit, dirty, digest), so they follow the dependency layers.
COPY source/ /opt/verl-source/
ARG RUNTIME_VERSION
ARG VERL_SOURCE
ARG VERL_SOURCE_COMMIT=
ARG VERL_SOURCE_DIRTY=false
ARG VERL_SOURCE_DIGEST=
# The checks of the verl flavour, on the source as the trainer sees it (user 1000, /tmp): `import verl` gives its
# version, and its own Hydra files compose main_ppo's config.
USER 1000:1000
RUN cd /tmp && HOME=/tmp python3 /opt/verl-deploy/verify.py verl && rm -rf /tmp/outputs
LABEL org.opencontainers.image.description="verl from ${VERL_SOURCE} (verl ${RUNTIME_VERSION}), variant ${VARIANT}" \
      org.opencontainers.image.version="${RUNTIME_VERSION}" \
      verl-deploy.runtime-version="${RUNTIME_VERSION}" \
      verl-deploy.verl-source="${VERL_SOURCE}" \
      verl-deploy.verl-source-commit="${VERL_SOURCE_COMMIT}" \
      verl-deploy.verl-source-dirty="${VERL_SOURCE_DIRTY}" \
      verl-deploy.verl-source-digest="${VERL_SOURCE_DIGEST}"
WORKDIR /workspace
ENTRYPOINT ["python3", "/opt/verl-deploy/secrets.py"]
CMD ["python3", "-c", "import verl; print(verl.__version__)"]

# ---- runtime-with-ca: `--keep-ca-bundle` only. ---------------------------------------------------------------
FROM runtime AS runtime-with-ca
USER 0:0
COPY --from=deps /extras/ca-bundle.pem /etc/verl-deploy/ca-bundle.pem
USER 1000:1000
ENV SSL_CERT_FILE=/etc/verl-deploy/ca-bundle.pem \
    REQUESTS_CA_BUNDLE=/etc/verl-deploy/ca-bundle.pem \
    PIP_CERT=/etc/verl-deploy/ca-bundle.pem
