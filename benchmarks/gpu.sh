#!/usr/bin/env bash
# The GPU benchmark, one prepared run: ResNet-18, 32x32 input, batch 512 (config/bench_gpu.yaml).
# Writes results/bench-gpu.csv: per method, s/step and images/s against the bare loop (bf16 autocast,
# channels_last, fused optimiser as the engine uses them on CUDA), views/s against model images/s, and
# Sinkhorn at 50k x 3000 on the GPU. Needs the project installed with a CUDA torch (pip install -e '.[gpu]').
# Usage: benchmarks/gpu.sh [extra `sslbench bench` arguments, e.g. --methods simclr moco]
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
exec sslbench bench --device cuda --config config/bench_gpu.yaml --sections step views sinkhorn \
    --out results/bench-gpu.csv "$@"
