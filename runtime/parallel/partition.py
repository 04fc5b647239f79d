"""Split a model's layers into contiguous stages balanced by (measured or estimated) cost."""

from __future__ import annotations

import functools

from runtime.config import USER_MODEL_KIND, LayoutError, ModelSpec


def estimate_layer_costs(spec: ModelSpec) -> list[float]:
    """Relative forward+backward cost per layer from multiply-adds (used when nothing was profiled);
    a user's model not profiled (no `layer_costs` in its contract): the same cost for every layer."""
    if spec.kind == USER_MODEL_KIND:
        return [1.0] * spec.num_layers
    c, t, v = spec.n_embd, spec.seq_len, spec.vocab_size
    if spec.kind == "gpt":
        block = 12 * c * c * t + 2 * t * t * c
        return [float(c * t)] + [float(block)] * spec.n_layer + [float(c * v * t)]
    return [float(spec.in_features * c)] + [float(c * c)] * spec.n_layer + [float(c * v)]


def partition_layers(costs: list[float], parts: int, *,
                     parameters: list[int] | list[float] | None = None) -> list[tuple[int, int]]:
    """Contiguous `[lo, hi)` layer ranges, one per stage, minimising the most expensive stage.

    Exact dynamic programme over split points (layers are few), ties broken towards earlier cuts.
    Memoised: a layout of a fleet cuts every pipeline of the same size the same way.
    `parameters` (per layer, a count or bytes; None: every layer holds some): a layer without
    parameters joins the stage of the next layer that has some (trailing ones: of the last such
    layer), since a stage without parameters would have nothing to train or all-reduce.
    """
    if parameters is None or all(p > 0 for p in parameters):
        return list(_partition(tuple(costs), parts))
    units = _units(parameters)
    if parts > len(units):
        raise LayoutError(f"cannot split {len(costs)} layers into {parts} stages: only {len(units)} of them hold "
                          f"parameters (the others join a neighbour's stage); expected at most {len(units)} stages")
    bounds = _partition(tuple(sum(costs[lo:hi]) for lo, hi in units), parts)
    return [(units[first][0], units[end - 1][1]) for first, end in bounds]


def _units(parameters: list[int] | list[float]) -> list[tuple[int, int]]:
    """The layers grouped so that each group ends at a layer with parameters (trailing layers
    without join the last group): the pieces a stage boundary may fall between."""
    units: list[tuple[int, int]] = []
    start = 0
    for i, held in enumerate(parameters):
        if held > 0:
            units.append((start, i + 1))
            start = i + 1
    if not units:
        raise LayoutError("no layer of the model holds parameters; expected at least one layer to train")
    if start < len(parameters):
        units[-1] = (units[-1][0], len(parameters))
    return units


@functools.lru_cache(maxsize=256)
def _partition(costs: tuple[float, ...], parts: int) -> tuple[tuple[int, int], ...]:
    n = len(costs)
    if parts < 1:
        raise LayoutError(f"cannot split into {parts} stages; expected at least 1")
    if parts > n:
        raise LayoutError(f"cannot split {n} layers into {parts} stages; expected at most {n} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][i]: minimal max-stage cost of the first i layers in k stages; cut[k][i]: last cut.
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i] - 1e-12:
                    best[k][i], cut[k][i] = value, j
    bounds, i = [], n
    for k in range(parts, 0, -1):
        j = cut[k][i]
        bounds.append((j, i))
        i = j
    return tuple(bounds[::-1])
