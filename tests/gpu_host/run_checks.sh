#!/usr/bin/env bash
# The GPU path's checks on a host with a CUDA GPU and a CUDA build of torch (no Django, Celery or
# database needed): the `gpu` tests, `bench runtime --device cuda --quick` and a CUDA-event profile.
# Usage: bash tests/gpu_host/run_checks.sh OUT_DIR   (docs/runtime.md: "The GPU path" says how; its Benchmark table has the results)
#        BENCH_FLAGS= bash tests/gpu_host/run_checks.sh OUT_DIR   the benchmark's full length (default --quick)
set -u
out=${1:-var/gpu-checks}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 SPOTPIPE_DEV=1
step() { echo; echo "== $(date -u +%H:%M:%S) $*"; }
step host
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$py -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
step "gpu tests"
timeout 330 $py -m pytest -q -o timeout=150 -p no:cacheprovider tests/runtime/test_gpu.py tests/runtime/test_device.py \
  -rA -s --durations=0 --junitxml="$out/gpu-tests.xml" 2>&1 | tee "$out/gpu-tests.log" | grep -v "^$" | tail -60
bench_flags=${BENCH_FLAGS-"--quick"}
step "bench runtime --device cuda $bench_flags"
timeout 300 $py -m bench runtime --device cuda $bench_flags --json "$out/bench-runtime-cuda.json" 2>&1 | tee "$out/bench.log" | tail -30
cp var/bench/runtime_device/runtime_gpu.html "$out/" 2>/dev/null
step "planner profile on the GPU (CUDA events)"
timeout 60 $py -m runtime.planner profile --device cuda --instance-type gpu-check --kind gpt --n-layer 8 --n-embd 512 \
  --n-head 8 --seq-len 256 --vocab-size 8192 --microbatch-size 4 --store "$out/profiles" 2>&1 | tail -3
step done
