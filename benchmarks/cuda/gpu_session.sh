#!/usr/bin/env bash
# What a lent GPU machine checks, run from the repository's root by the device tool with the
# wheels of benchmarks/cuda/gpu_wheels.sh carried in .whl; each step's output lands in
# $OUT/<step>.log:
#   tests  the tests of tests/cuda, whose GPU variants run only there: every op, the graph-IR
#          models, gemm, the convolutions as products, 200 steps of the GW models vs torch
#   bench  the train-step benchmark against torch eager and torch.compile (JSON and table)
#   gw     the main job on the GPU (`rootclad gw run --device cuda`, the default preset)
# Each starts with nvidia-smi and `rootclad doctor` (environment.log). A step after a failing
# one still runs; the exit status is the first failure's. One device call may run 10 minutes:
# give `tests` a call of its own, then `bench gw`.
#
#   device tool:  bash benchmarks/cuda/gpu_session.sh cuda tests       (carry: [".whl"])
#                 bash benchmarks/cuda/gpu_session.sh cuda bench gw
#   a check here: OUT=/tmp/gpu_session bash benchmarks/cuda/gpu_session.sh cpu tests bench
set -u -o pipefail
DEVICE=${1:-cuda}
shift || true
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(tests bench gw)
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
step() { # step NAME COMMAND...: runs it, its output into $OUT/NAME.log
  local name=$1
  shift
  echo "== $name: $*"
  local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 15 "$OUT/$name.log"
  echo "== $name: exit $rc after $((SECONDS - t0)) s"
  if [ $rc -ne 0 ] && [ $status -eq 0 ]; then status=$rc; fi
}
step environment bash -c "date -u; nvidia-smi || true; python3 -m rootclad doctor"
for s in "${STEPS[@]}"; do
  case $s in
    tests)
      xdist=()
      if python3 -c "import xdist" 2> /dev/null; then
        xdist=(-n "$(python3 -c 'import os; print(min(8, os.cpu_count() or 1))')")
      fi
      step tests python3 -m pytest -q -p no:cacheprovider -p no:benchmark "${xdist[@]}" tests/cuda
      ;;
    bench)
      quick=()
      [ "$DEVICE" = cpu ] && quick=(--quick)
      step bench python3 benchmarks/cuda/bench_train_step.py --device "$DEVICE" "${quick[@]}" \
        --out "$OUT/cuda_train_step.json"
      ;;
    gw)
      step gw python3 -m rootclad gw run --device "$DEVICE" --out "$OUT/gw-run" -q
      for f in summary.json report.md; do
        [ -f "$OUT/gw-run/$f" ] && cp "$OUT/gw-run/$f" "$OUT/gw_run_$f"
      done
      rm -rf "$OUT/gw-run" # too deep and too large to come back; its summary is kept
      ;;
    *)
      echo "unknown step $s (tests, bench, gw)"
      exit 2
      ;;
  esac
done
exit $status
