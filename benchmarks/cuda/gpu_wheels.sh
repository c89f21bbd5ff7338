#!/usr/bin/env bash
# Downloads, into .whl/ (git ignores *.whl), the wheels that the lent GPU machines lack for
# benchmarks/cuda/gpu_session.sh: their image has python3 3.12 with torch, numpy, scipy,
# matplotlib, tqdm, onnx, onnxruntime, pytest and pytest-xdist, not these (about 13 MB).
# Run here, in the repository's root, where pip reaches PyPI; then name ".whl" in the device
# tool's `carry`.
set -euo pipefail
mkdir -p .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  scipy-openblas32 uproot awkward awkward-cpp cramjam lz4
ls -l .whl
