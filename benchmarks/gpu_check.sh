#!/usr/bin/env bash
# One prepared GPU check for a session that is lent a CUDA device (issue 14, item 9): under 8 minutes.
#
#   1. the CUDA tests (pytest -m gpu: they skip without CUDA);
#   2. certification tokens/s on the GPU: benchmarks/certify_speed.py --device cuda (d_sae 256 and 4096
#      on MiniLM activations, forward+metrics vs certify_sae side by side, streamed tokens);
#   3. the gradient solver, CPU vs CUDA: benchmarks/gradient_gpu.py;
#   4. the DNN relaxation solver, CPU vs CUDA: benchmarks/dnn_gpu.py;
#   5. the wide-SAE grid's GPU cells (issue 31): benchmarks/certify_scale.py --device cuda (--dry-run on the CPU).
#
# Usage (repository root):   bash benchmarks/gpu_check.sh            # the GPU run
#                            bash benchmarks/gpu_check.sh --cpu      # checks every piece on the CPU, small sizes
# Output: logs and result files under $OUT if set (else benchmarks/results/gpu_check/).
# Each step has its own time limit; a failing step is reported and the others still run;
# the exit status is the number of failed steps.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DEVICE=cuda
QUICK=""
if [ "${1:-}" = "--cpu" ]; then DEVICE=cpu; QUICK="--quick"; fi
DEST="${OUT:-benchmarks/results/gpu_check}"
mkdir -p "$DEST"
CACHE="${WIDELIMIT_CACHE:-${TMPDIR:-/tmp}/widelimit-certify-speed}"
FAILED=0
START=$(date +%s)

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    local t0=$(date +%s)
    echo "== $name (limit ${limit}s): $*" | tee -a "$DEST/summary.txt"
    timeout "$limit" "$@" > "$DEST/$name.log" 2>&1
    local rc=$?
    echo "   -> exit $rc after $(( $(date +%s) - t0 ))s (log: $DEST/$name.log)" | tee -a "$DEST/summary.txt"
    tail -n 5 "$DEST/$name.log" | sed 's/^/   | /' | tee -a "$DEST/summary.txt"
    [ $rc -eq 0 ] || FAILED=$((FAILED + 1))
}

: > "$DEST/summary.txt"
python3 - <<'PY' | tee -a "$DEST/summary.txt"
import torch
print("torch", torch.__version__, "cuda available:", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY

if [ "$DEVICE" = cuda ]; then
    step cuda_tests 100 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/
    step certify_speed 180 python3 benchmarks/certify_speed.py --device cuda --repeat 2 --stream-tokens 100000 \
        --cache "$CACHE" --out "$DEST"
    step gradient_gpu 70 python3 benchmarks/gradient_gpu.py --N 20000 --n 256 --width 1024 --steps 10 --out "$DEST"
    step dnn_gpu 60 python3 benchmarks/dnn_gpu.py --devices cuda,cpu --sizes 100,200 --time-limit 20 --out "$DEST"
    step certify_scale 60 python3 benchmarks/certify_scale.py --device cuda --tokens 4000 \
        --cells 768x16384x100,768x65536x100,2304x16384x100 --name certify_scale_gpu
    cp benchmarks/results/certify_scale_gpu.* "$DEST"/ 2>/dev/null  # (the script writes to benchmarks/results/)
else
    step cuda_tests 150 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/
    step certify_speed 400 python3 benchmarks/certify_speed.py --device cpu --quick --widths 256 --stream-sae 256 \
        --cache "$CACHE" --out "$DEST"
    step gradient_gpu 120 python3 benchmarks/gradient_gpu.py --devices cpu --quick --out "$DEST"
    step dnn_gpu 120 python3 benchmarks/dnn_gpu.py --devices cpu,cuda --quick --out "$DEST"
    step certify_scale 120 python3 benchmarks/certify_scale.py --device cpu --dry-run
fi
echo "== done in $(( $(date +%s) - START ))s, $FAILED step(s) failed" | tee -a "$DEST/summary.txt"
exit $FAILED
