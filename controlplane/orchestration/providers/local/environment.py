"""What a local node inherits of the control plane's environment.

A local node runs the agent and, under it, a team's own code (its model, its dataset function, its
requirements), as a cloud VM does. The control plane's own environment holds its secrets
(`SECRET_KEY`, `DATABASE_URL` with its password, the cloud's keys, the metrics token), so a node
gets only what a process needs to run, the knobs of torch and the GPU, and the node-side settings
the agent and the runtime read; anything else an operator wants the nodes to have (credentials
scoped to the artifact store, a process marker) is named in `SPOTPIPE_LOCAL_NODE_ENV`.
"""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.tunables import tunable

# A process's ground: where things are, locale, temp, proxies and CA bundles (a job's requirements
# are installed on the node).
_SYSTEM = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "TERM",
    "PYTHONPATH", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS", "VIRTUAL_ENV",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
})
# Read on the node: the agent's, the data cache's and the local identity signer's settings.
_NODE_SETTINGS = frozenset({
    "LOG_LEVEL", "SPOTPIPE_GPU_INDEX", "SPOTPIPE_DATA_CACHE", "SPOTPIPE_WORKER_MODULE",
    "SPOTPIPE_LOCAL_IDENTITY_KEY", "SPOTPIPE_LOCAL_IDENTITY_ACCOUNT", "SPOTPIPE_LOCAL_IDENTITY_REGION",
})
# Families of knobs: locale, package installers (a private index), threads, collectives, torch, GPUs.
_PREFIXES = ("LC_", "XDG_", "PIP_", "UV_", "OMP_", "MKL_", "OPENBLAS_", "NCCL_", "GLOO_", "TORCH_", "CUDA_",
             "CUBLAS_", "NVIDIA_")


def node_environment(parent: Mapping[str, str]) -> dict[str, str]:
    """The variables of `parent` (the control plane's environment) a local node gets."""
    named = {name.strip() for name in tunable("SPOTPIPE_LOCAL_NODE_ENV") if name.strip()}
    return {name: value for name, value in parent.items()
            if name in _SYSTEM or name in _NODE_SETTINGS or name in named or name.startswith(_PREFIXES)}
