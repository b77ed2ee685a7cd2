#!/usr/bin/env bash
# One-shot validation of the copy kernels on a machine with an NVIDIA GPU (<= 7 minutes: the
# step timeouts below add up to 420 s):
#   1. tierdiag doctor --json                      -> doctor.json
#   2. tierdiag calibrate --json (torch + Triton)  -> calibrate.json, profile.json
#   3. pytest -m "cuda or triton", compiled (TRITON_INTERPRET unset) -> pytest.txt
#   4. GB/s table: torch path, Triton kernel, pinned contiguous copy (ceiling), load-back and
#      backup, 16 KiB-2 MiB pages x 1-4,096 pages (benchmarks/gpu_table.py) -> gpu_table.{txt,json}
#   5. a small Triton load-back's fixed cost split (plan, index upload, wrapper, launch, GPU time)
#      and a cProfile of 200 of them (benchmarks/gpu_overhead.py) -> gpu_overhead.{txt,json}
# Everything goes under $OUT (or ./gpu-results/), with summary.txt: one line per step and its
# exit status. Without a GPU it still runs end to end: doctor, a CPU calibrate and the table
# script run, the GPU parts print "skipped: no CUDA GPU ..." and are recorded as skipped.
# Exit status: 0 unless a step failed.
#
#   benchmarks/gpu_check.sh [--quick]      (GPU_CHECK_QUICK=1 does the same: fewer sizes/repeats)
set -uo pipefail
cd "$(dirname "$0")/.."

QUICK="${GPU_CHECK_QUICK:-0}"
[ "${1:-}" = "--quick" ] && QUICK=1
DEST="${OUT:-./gpu-results}"
mkdir -p "$DEST"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
TIERDIAG=("$PY" -c "from tierdiag.cli.main import main; main()")
SUMMARY="$DEST/summary.txt"
: > "$SUMMARY"
FAILED=0

say() { echo "gpu_check: $*" | tee -a "$SUMMARY"; }

step() {  # step NAME TIMEOUT_S CMD... : stdout -> NAME.out, stderr -> NAME.err
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$DEST/$name.out" 2> "$DEST/$name.err"
  local rc=$?
  if [ $rc -eq 0 ]; then
    say "$name: ok ($((SECONDS - t0)) s)"
  else
    say "$name: FAILED, exit $rc ($((SECONDS - t0)) s; see $DEST/$name.err)"
    FAILED=1
  fi
}

HAS_GPU=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
say "start $(date -u +%FT%TZ), quick=$QUICK, gpu=$HAS_GPU, python=$PY, results in $DEST"

step doctor 30 "${TIERDIAG[@]}" doctor --json
mv "$DEST/doctor.out" "$DEST/doctor.json"

CAL=(calibrate --json --out "$DEST/profile.json")
[ "$QUICK" = 1 ] && CAL+=(--quick)
step calibrate 90 "${TIERDIAG[@]}" "${CAL[@]}"
mv "$DEST/calibrate.out" "$DEST/calibrate.json"

if [ "$HAS_GPU" = 1 ]; then
  # compiled, not interpreted: the tests pick the GPU when TRITON_INTERPRET is unset
  step pytest 150 env -u TRITON_INTERPRET "$PY" -m pytest -q -p no:cacheprovider -m "cuda or triton" \
    tests/engine/test_kernels.py tests/engine/test_kernels_triton.py
  mv "$DEST/pytest.out" "$DEST/pytest.txt"
else
  say "pytest: skipped: no CUDA GPU (the triton cases run under the interpreter in make test)"
fi

TABLE=(benchmarks/gpu_table.py --json "$DEST/gpu_table.json")
[ "$QUICK" = 1 ] && TABLE+=(--quick)
# without a GPU the script itself prints "gpu table: skipped: ..." and records why in the JSON
step gpu_table 90 "$PY" "${TABLE[@]}"
mv "$DEST/gpu_table.out" "$DEST/gpu_table.txt"
cat "$DEST/gpu_table.txt" | tee -a "$SUMMARY"

step gpu_overhead 60 "$PY" benchmarks/gpu_overhead.py --profile --json "$DEST/gpu_overhead.json"
mv "$DEST/gpu_overhead.out" "$DEST/gpu_overhead.txt"
head -8 "$DEST/gpu_overhead.txt" | tee -a "$SUMMARY"

say "done in $SECONDS s; $([ $FAILED = 0 ] && echo 'all steps ok' || echo 'some steps FAILED')"
exit $FAILED
