"""Planner checks: throughput-model error against the runtime, search optimality and speed, and the
learned profile predictor.

`python -m bench planner [--quick]`:
1. runs layouts of the MLP/GPT on local gloo processes with the runtime's executor (emulated device
   time) and compares the measured step time with the throughput model's replay (MAPE);
2. plans jobs over a grid of >= 200 candidates and compares the planner's pick (closed-form
   screening + replay of the best few) with the exhaustive optimum (replay of every candidate), and
   times the search;
3. profiles models on this CPU and checks the learned predictor on (model, device) pairs it was not
   fitted on.
"""

from __future__ import annotations

import statistics
import time

from bench.report import Progress, print_table
from runtime.config import ModelSpec
from runtime.planner.predictor import ProfilePredictor
from runtime.planner.profile import measure_local_device, profile_model
from runtime.planner.search import Planner, PlanRequest, Pool
from runtime.train.plan_check import CALIBRATION, VALIDATION, fit_overheads, measure, predict

SCENARIOS = [
    ("deadline 48 h", {"deadline_hours": 48.0}),
    ("deadline 8 h", {"deadline_hours": 8.0}),
    ("budget $100", {"budget_usd": 100.0}),
    ("budget $30", {"budget_usd": 30.0}),
    ("deadline 10 h + budget $60", {"deadline_hours": 10.0, "budget_usd": 60.0}),
]
SAMPLES = 5_000_000


def throughput_validation(*, quick: bool, progress: Progress) -> dict:
    cal = {}
    for i, case in enumerate(CALIBRATION):
        progress.step(f"calibration run {case.label}", i + 1, len(CALIBRATION))
        cal[case] = measure(case)
    latency, overhead = fit_overheads(cal)
    cases = VALIDATION[:4] if quick else VALIDATION
    rows, out = [], []
    for i, case in enumerate(cases):
        progress.step(f"validation run {case.label}", i + 1, len(cases))
        measured = measure(case)
        predicted = predict(case, latency_s=latency, step_overhead_s=overhead)
        ideal = predict(case, latency_s=0.0, step_overhead_s=0.0)
        err = abs(predicted - measured) / measured
        rows.append([case.label, measured * 1000, predicted * 1000, ideal * 1000, err * 100])
        out.append(
            {
                "layout": case.label,
                "measured_step_ms": measured * 1000,
                "predicted_step_ms": predicted * 1000,
                "device_time_only_ms": ideal * 1000,
                "abs_pct_error": err * 100,
            }
        )
    mape = statistics.mean(r["abs_pct_error"] for r in out)
    baseline = statistics.mean(
        abs(r["device_time_only_ms"] - r["measured_step_ms"]) / r["measured_step_ms"] * 100 for r in out
    )
    print_table(
        f"throughput model vs runtime (emulated device time, gloo on this host): "
        f"latency {latency * 1e6:.0f} us and step overhead {overhead * 1000:.0f} ms fitted on "
        f"{len(cal)} calibration layouts; MAPE {mape:.1f}% over {len(out)} other layouts "
        f"(baseline, device time only: {baseline:.1f}%)",
        ["layout", "measured ms", "predicted ms", "device-time-only ms", "abs err %"],
        rows,
    )
    return {
        "mode": "emulated device time (runtime DeviceTime padding), gloo processes on this host",
        "calibration": {c.label: t * 1000 for c, t in cal.items()},
        "fitted_message_latency_us": latency * 1e6,
        "fitted_step_overhead_ms": overhead * 1000,
        "layouts": out,
        "mape_percent": mape,
        "baseline_mape_device_time_only_percent": baseline,
        "target_mape_percent": 10.0,
    }


def optimality(*, progress: Progress) -> dict:
    spec = ModelSpec(kind="gpt", n_layer=24, n_embd=1024, n_head=16, seq_len=512, vocab_size=8192)
    pools = [
        Pool(instance_type="p3.2xlarge", spot_usd_per_hour=0.92, preemptions_per_node_hour=0.3, max_nodes=32),
        Pool(instance_type="g5.xlarge", spot_usd_per_hour=0.40, preemptions_per_node_hour=0.2, max_nodes=32),
        Pool(instance_type="g4dn.xlarge", spot_usd_per_hour=0.21, preemptions_per_node_hour=0.1, max_nodes=32),
        Pool(instance_type="g6.xlarge", spot_usd_per_hour=0.41, preemptions_per_node_hour=0.15, max_nodes=32),
    ]
    planner = Planner()
    for pool in pools:  # profiles are predicted (or loaded) once per type, before any search
        planner.cost_model(spec, pool.instance_type, 8)
    rows, out = [], []
    for i, (name, limits) in enumerate(SCENARIOS):
        progress.step(f"planning {name}", i + 1, len(SCENARIOS))
        request = PlanRequest(model=spec, global_batch=256, samples=SAMPLES, pools=pools, **limits)
        for pool in pools:  # cold replay caches: time the search as a fresh request sees it
            planner.cost_model(spec, pool.instance_type, 8)._cache.clear()
        started = time.perf_counter()
        plan = planner.plan(request)
        search_s = time.perf_counter() - started
        exhaustive = planner.plan(request, exhaustive=True)
        key = "hours" if "budget_usd" in limits and "deadline_hours" not in limits else "cost_usd"
        picked, optimum = getattr(plan.best, key), getattr(exhaustive.best, key)
        gap = (picked - optimum) / optimum * 100
        rows.append(
            [
                name,
                plan.considered,
                search_s,
                f"{plan.best.nodes} x {plan.best.instance_type} dp{plan.best.dp} pp{plan.best.pp} {plan.best.schedule}",
                picked,
                optimum,
                gap,
            ]
        )
        out.append(
            {
                "scenario": name,
                "candidates": plan.considered,
                "search_seconds": search_s,
                "objective": key,
                "planner_pick": plan.best.to_dict(),
                "planner_value": picked,
                "exhaustive_value": optimum,
                "gap_percent": gap,
            }
        )
    print_table(
        "planner pick vs exhaustive optimum (every candidate replayed), GPT 24 x 1024, 5 M samples",
        ["scenario", "candidates", "search s", "pick", "pick value", "optimum", "gap %"],
        rows,
    )
    return {
        "scenarios": out,
        "max_gap_percent": max(r["gap_percent"] for r in out),
        "max_search_seconds": max(r["search_seconds"] for r in out),
        "min_candidates": min(r["candidates"] for r in out),
    }


def predictor_check(*, quick: bool, progress: Progress) -> dict:
    """Fit on float32 CPU profiles of some models; predict held-out models, and a device never measured
    in the fit: the same CPU computing in float64 (about half the peak FLOP/s, twice the bytes)."""
    widths = (32, 96) if quick else (32, 64, 96, 128)
    specs = [
        ModelSpec(kind=k, n_layer=2, n_embd=w, n_head=4, seq_len=32, vocab_size=128, in_features=64)
        for w in widths
        for k in ("gpt", "mlp")
    ]
    progress.step("profiling in float32 and float64")
    one = [profile_model(s, microbatch_size=8, repeats=7, threads=1) for s in specs]
    two_device = measure_local_device(threads=1, dtype="float64")
    two = [profile_model(s, microbatch_size=8, repeats=7, threads=1, device=two_device) for s in specs]
    rows, out = [], []

    def total(p) -> float:  # type: ignore[no-untyped-def]
        return sum(sum(x) for x in p.fiw())

    for i, target in enumerate(one):  # leave one model out, same device
        fitted = ProfilePredictor.fit([p for j, p in enumerate(one) if j != i])
        pred = fitted.predict(target.spec, microbatch_size=8, device=target.device, instance_type="x")
        err = abs(total(pred) - total(target)) / total(target) * 100
        rows.append(["held-out model, float32", f"{target.model['kind']} {target.model['n_embd']}", err])
        out.append({"case": "held-out model", "model": target.model, "abs_pct_error": err})
    fitted = ProfilePredictor.fit(one)
    for target in two:  # a device never measured in the fit
        pred = fitted.predict(target.spec, microbatch_size=8, device=target.device, instance_type="x")
        err = abs(total(pred) - total(target)) / total(target) * 100
        rows.append(["unmeasured device (float64)", f"{target.model['kind']} {target.model['n_embd']}", err])
        out.append({"case": "unmeasured device", "model": target.model, "abs_pct_error": err})
    print_table(
        f"learned profile predictor: per-model step compute (F+I+W), "
        f"float32 device {one[0].device.peak_tflops * 1000:.0f} GFLOP/s, float64 {two_device.peak_tflops * 1000:.0f}",
        ["case", "model", "abs err %"],
        rows,
    )
    return {
        "coefficients_fitted_on_float32": fitted.coefficients,
        "cases": out,
        "mape_held_out_model_percent": statistics.mean(
            r["abs_pct_error"] for r in out if r["case"] == "held-out model"
        ),
        "mape_unmeasured_device_percent": statistics.mean(
            r["abs_pct_error"] for r in out if r["case"] == "unmeasured device"
        ),
    }


def run(*, quick: bool, progress: Progress) -> dict:
    figures = {"search": optimality(progress=progress)}
    figures["predictor"] = predictor_check(quick=quick, progress=progress)
    figures["throughput_model"] = throughput_validation(quick=quick, progress=progress)
    return figures
