# Images by role (pyproject.toml's extras; docs/architecture.md, "Roles and dependencies"):
#   docker build --target controlplane -t spotpipe-controlplane .  web server and Celery beat
#   docker build --target node -t spotpipe-node .                  a training node: agent + runtime, no Django
#   docker build --target node-gpu -t spotpipe-node-gpu .          the same for GPU VMs, with torch's CUDA build
#                                                                  (README, "GPU nodes")
#   docker build --target all -t spotpipe .                        the Celery worker whose local provider runs
#                                                                  nodes in its own container, and the demo
# docker-compose.yml builds the ones it runs. Every dependency has a wheel for Python 3.11 on
# manylinux (psycopg[binary] included), so no compiler is installed. Every target but node-gpu has
# the CPU build of torch; BuildKit (Docker's default builder since 23.0) builds only the stages a
# target needs, so the others never download the CUDA build.

# The sources, in one place for both torch bases below.
FROM scratch AS sources
WORKDIR /app
COPY pyproject.toml README.md manage.py ./
COPY controlplane ./controlplane
COPY agent ./agent
COPY runtime ./runtime
COPY frontend ./frontend
COPY bench ./bench
COPY spotpipe ./spotpipe

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
# CPU build of torch from PyTorch's CPU index first, so no extra below can pull a multi-GB CUDA
# build (the planner needs torch's meta device in the control plane too).
RUN pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
COPY --from=sources /app ./

# The CUDA build of the same torch, from PyTorch's CUDA 12.8 index (its wheels bring the CUDA
# libraries; only the driver comes from the host). Installed first, like the CPU build in `base`,
# so `.[runtime]`'s torch==2.13.0 is already met (2.13.0+cu128) and no CPU build is ever installed.
# The host needs the NVIDIA driver and the NVIDIA Container Toolkit: docker run --gpus all ...
# (a job picks the GPU with the agent's --gpu-index / SPOTPIPE_GPU_INDEX).
FROM python:3.11-slim AS base-gpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /app
RUN pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cu128
COPY --from=sources /app ./

FROM base AS controlplane
RUN pip install ".[controlplane]"
EXPOSE 8000
CMD ["python", "-m", "granian", "--interface", "asgi", "--host", "0.0.0.0", "--port", "8000", "--workers", "3", "--backlog", "4096", "--backpressure", "4096", "--no-ws", "controlplane.asgi:application"]

FROM base AS node
RUN pip install ".[runtime]"
CMD ["spotpipe-agent", "--help"]

FROM base-gpu AS node-gpu
RUN pip install ".[runtime]"
CMD ["spotpipe-agent", "--help"]

FROM base AS all
RUN pip install ".[controlplane,runtime]"
EXPOSE 8000
CMD ["python", "-m", "granian", "--interface", "asgi", "--host", "0.0.0.0", "--port", "8000", "--workers", "3", "--backlog", "4096", "--backpressure", "4096", "--no-ws", "controlplane.asgi:application"]
