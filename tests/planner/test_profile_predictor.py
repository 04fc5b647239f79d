"""Profiler output, the profile store, and the learned predictor (fitted on synthetic truth)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from runtime.config import ModelSpec
from runtime.planner.predictor import DIRECTIONS, ProfilePredictor, layer_features
from runtime.planner.profile import DeviceSpec, LayerProfile, ModelProfile, ProfileStore, profile_model

MLP = ModelSpec(kind="mlp", n_layer=2, n_embd=16, in_features=8, vocab_size=4)


def test_profile_measures_every_layer_and_direction():
    prof = profile_model(MLP, microbatch_size=4, repeats=2, device=DeviceSpec("cpu", 0.1, 10.0))
    assert len(prof.layers) == MLP.num_layers
    first = prof.layers[0]
    assert first.backward_input_s == 0.0  # the input layer has no activation gradient to compute
    assert all(lay.forward_s > 0 and lay.backward_weight_s > 0 for lay in prof.layers)
    assert all(lay.backward_input_s > 0 for lay in prof.layers[1:])
    # Linear(8 -> 16): 8*16 weights + 16 biases, fp32.
    assert first.param_bytes == (8 * 16 + 16) * 4
    assert first.output_bytes == 4 * 16 * 4


def test_layer_features_count_flops_of_a_linear_layer():
    feats = layer_features(MLP, microbatch_size=4)
    assert feats[0].forward_flops == 2 * 4 * 8 * 16
    assert feats[1].forward_flops == 2 * 4 * 16 * 16
    assert not feats[0].has_input_grad and feats[1].has_input_grad


def test_store_round_trip(tmp_path):
    prof = profile_model(MLP, microbatch_size=4, repeats=1, device=DeviceSpec("cpu", 0.1, 10.0), instance_type="local")
    store = ProfileStore(tmp_path)
    path = store.save(prof)
    assert path.parent.name == "local"
    loaded = store.load("local", MLP, 4)
    assert loaded is not None and loaded.fiw() == prof.fiw()
    assert store.load("p3.2xlarge", MLP, 4) is None
    assert len(store.all()) == 1


def _synthetic_profile(spec: ModelSpec, device: DeviceSpec, coef: dict[str, list[float]]) -> ModelProfile:
    layers = []
    for f in layer_features(spec, microbatch_size=8):
        nbytes = f.param_bytes + f.activation_bytes + f.output_bytes
        t = {
            d: coef[d][0] * f.forward_flops / (device.peak_tflops * 1e12)
            + coef[d][1] * nbytes / (device.memory_bandwidth_gbs * 1e9)
            + coef[d][2] * f.ops * 1e-6
            for d in DIRECTIONS
        }
        layers.append(
            LayerProfile(
                forward_s=t["forward_s"],
                backward_input_s=t["backward_input_s"] if f.has_input_grad else 0.0,
                backward_weight_s=t["backward_weight_s"],
                forward_flops=f.forward_flops,
                param_bytes=f.param_bytes,
                activation_bytes=f.activation_bytes,
                output_bytes=f.output_bytes,
                ops=f.ops,
            )
        )
    return ModelProfile(instance_type=device.name, device=device, model=asdict(spec), microbatch_size=8, layers=layers)


def test_predictor_recovers_known_coefficients_and_transfers_to_a_new_device():
    truth = {"forward_s": [2.0, 0.5, 3.0], "backward_input_s": [2.2, 0.0, 4.0], "backward_weight_s": [3.0, 1.0, 5.0]}
    slow = DeviceSpec("slow", peak_tflops=0.2, memory_bandwidth_gbs=20.0)
    specs = [
        ModelSpec(kind=k, n_layer=2, n_embd=w, n_head=2, seq_len=8, vocab_size=32, in_features=16)
        for w in (16, 32, 64)
        for k in ("gpt", "mlp")
    ]
    fitted = ProfilePredictor.fit([_synthetic_profile(s, slow, truth) for s in specs])
    for d in DIRECTIONS:
        assert fitted.coefficients[d] == pytest.approx(truth[d], rel=1e-3, abs=1e-6)
    fast = DeviceSpec("fast", peak_tflops=100.0, memory_bandwidth_gbs=900.0)
    target = ModelSpec(kind="gpt", n_layer=3, n_embd=48, n_head=4, seq_len=8, vocab_size=32)
    predicted = fitted.predict(target, microbatch_size=8, device=fast, instance_type="fast")
    expected = _synthetic_profile(target, fast, truth)
    assert [sum(x) for x in predicted.fiw()] == pytest.approx([sum(x) for x in expected.fiw()], rel=1e-3)
    assert predicted.measured is False


def test_fit_needs_a_measured_profile():
    with pytest.raises(ValueError, match="profile at least one model"):
        ProfilePredictor.fit([])


def test_features_follow_the_device_dtype():
    f32 = layer_features(MLP, microbatch_size=4)
    f64 = layer_features(MLP, microbatch_size=4, dtype="float64")
    assert f64[1].param_bytes == 2 * f32[1].param_bytes
    assert f64[1].output_bytes == 2 * f32[1].output_bytes
    assert f64[1].forward_flops == f32[1].forward_flops


def test_a_model_functions_measures_for_one_sample_predict_as_the_same_layers_measured_whole():
    """`layer_measures` (one sample, as `spotpipe submit` records them) scaled to a micro-batch give
    the features the planner computes for the same layers as a built-in model: FLOPs and bytes grow
    linearly with the samples, parameters do not."""
    import torch

    from runtime.models.model import build_layer
    from runtime.planner.meta_features import measure_layers_per_sample

    with torch.device("meta"):
        layers = [build_layer(MLP, i, 0) for i in range(MLP.num_layers)]
    measures = measure_layers_per_sample(layers, torch.zeros((4, MLP.in_features)))
    user = ModelSpec(kind="py", path="mine.nets:mlp", layers=MLP.num_layers, layer_measures=measures)
    assert layer_features(user, microbatch_size=4) == layer_features(MLP, microbatch_size=4)
    assert user.layer_parameters() == MLP.layer_parameters() and user.max_stages == MLP.num_layers
    with pytest.raises(ValueError, match=r"has no model\.layer_measures"):
        layer_features(ModelSpec(kind="py", path="mine.nets:mlp", layers=4), microbatch_size=4)
