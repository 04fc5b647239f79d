# One image for web, worker, beat and demo nodes (cookiecutter-django style).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends build-essential libpq-dev \
    && rm -rf /var/lib/apt/lists/*
# CPU build of torch from PyTorch's CPU index: never a multi-GB CUDA download.
RUN pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY controlplane ./controlplane
COPY agent ./agent
COPY runtime ./runtime
COPY frontend ./frontend
COPY bench ./bench
COPY spotpipe ./spotpipe
COPY manage.py ./
RUN pip install -e .
EXPOSE 8000
CMD ["python", "-m", "granian", "--interface", "wsgi", "--host", "0.0.0.0", "--port", "8000", "--workers", "3", "--blocking-threads", "16", "--no-ws", "controlplane.wsgi:application"]
