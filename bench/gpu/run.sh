#!/usr/bin/env bash
# The CUDA engine's checks and figures on a GPU machine, in one call (bench/gpu/README.md):
# the GPU tests, gpt-small trained 200 steps in fp32 on the GPU against the CPU engine's
# first 10 steps, and tokens/s of gpt-small and gpt2-124m in bf16 (and fp32) against PyTorch
# eager on the same GPU. Needs the bundle bench/gpu/bundle.sh made (kc, the GPU tests, the
# shared libraries they need, the training data), the NVIDIA driver, and cuBLAS and NVRTC
# (CUDA's Python packages or a CUDA toolkit); PyTorch for the baseline.
#
#   bench/gpu/run.sh [BUNDLE] [RESULTS]     (defaults .gpu-bundle and /tmp/kc-gpu)
#
# Everything lands in RESULTS; with $OUT set (the device tool's folder), also packed into
# $OUT/kc-gpu-results.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUNDLE=$(realpath -m "${1:-.gpu-bundle}")
if [[ ! -d "$BUNDLE" && -f "$BUNDLE.tgz" ]]; then
  tar -C "$(dirname "$BUNDLE")" -xzf "$BUNDLE.tgz"
fi
[[ -x "$BUNDLE/bin/kc" ]] || { echo "no bundle at $BUNDLE (make it with bench/gpu/bundle.sh)"; exit 2; }
RESULTS=$(realpath -m "${2:-/tmp/kc-gpu}")
mkdir -p "$RESULTS"
STEPS_FP32=${STEPS_FP32:-200}
T0=$(date +%s)
stage() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }

# cuBLAS and NVRTC: from CUDA's Python packages (where pip put them) or a CUDA toolkit.
CUDA_LIBS=$(python3 - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = list(site.getsitepackages()) + [site.getusersitepackages()] + glob.glob("/usr/local/cuda*")
dirs = []
for root in roots:
    for pattern in ("**/libcublas.so*", "**/libnvrtc.so*"):
        for f in glob.glob(os.path.join(root, pattern), recursive=True):
            d = os.path.dirname(f)
            if "/stubs" not in d and d not in dirs:  # never the link-time stubs
                dirs.append(d)
print(":".join(dirs))
PY
)
echo "CUDA libraries from: ${CUDA_LIBS:-none found}" | tee "$RESULTS/libs.txt"
export LD_LIBRARY_PATH="$BUNDLE/lib:${CUDA_LIBS}:${LD_LIBRARY_PATH:-}"
# The bundle's binaries run on this machine's C library when it is recent enough, else on
# the one they were built with (shipped in sys/).
RUN=()
if ! "$BUNDLE/bin/kc" --help >/dev/null 2>"$RESULTS/kc-start.txt"; then
  echo "kc does not start on this machine's libraries ($(head -c 300 "$RESULTS/kc-start.txt")); using the bundle's own C library"
  RUN=("$BUNDLE/sys/ld-linux-x86-64.so.2" --library-path "$BUNDLE/sys:$BUNDLE/lib:$CUDA_LIBS")
fi
KC=("${RUN[@]}" "$BUNDLE/bin/kc")
DATA="$BUNDLE/data/fortunes/manifest.json"

stage "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$RESULTS/gpu.txt"

stage "GPU tests: hal kernels"
timeout 300 "${RUN[@]}" "$BUNDLE/bin/kc_cuda_kernels_gpu_test" >"$RESULTS/test-kernels.txt" 2>&1
grep -E "FAILED|Failure|error|PASSED|SKIPPED|TFLOP" "$RESULTS/test-kernels.txt" | head -n 40
stage "GPU tests: GPT kernels and model against the CPU engine"
timeout 300 "${RUN[@]}" "$BUNDLE/bin/kc_cuda_gpt_gpu_test" >"$RESULTS/test-gpt.txt" 2>&1
grep -E -A3 "FAILED|Failure|error:" "$RESULTS/test-gpt.txt" | head -n 80
grep -E "PASSED|SKIPPED" "$RESULTS/test-gpt.txt" | head -n 5

train() {  # NAME ARGS...: one kc train run into RESULTS/NAME
  local name=$1; shift
  stage "kc train $name: $*"
  timeout 300 "${KC[@]}" train "$@" --data "$DATA" --out "$RESULTS/$name" --progress none \
    --eval-every 0 >"$RESULTS/$name.txt" 2>&1
  tail -n 14 "$RESULTS/$name.txt"
}
train small-fp32 examples/models/gpt-small.yaml --device cuda --precision fp32 --steps "$STEPS_FP32"
train small-cpu examples/models/gpt-small.yaml --steps 10
train small-bf16 examples/models/gpt-small.yaml --device cuda --precision bf16 --steps 300
train gpt2-bf16 examples/models/gpt2-124m.yaml --device cuda --precision bf16 --steps 40
train gpt2-fp32 examples/models/gpt2-124m.yaml --device cuda --precision fp32 --steps 20

baseline() {  # NAME ARGS...
  local name=$1; shift
  stage "PyTorch eager $name: $*"
  timeout 300 python3 bench/gpu/torch_eager.py "$@" 2>"$RESULTS/torch-$name.err" | tee "$RESULTS/torch-$name.json"
  tail -n 5 "$RESULTS/torch-$name.err"
}
baseline small-bf16 --config examples/models/gpt-small.yaml --precision bf16 --steps 100 --warmup 20 --matmul-rate
baseline gpt2-bf16 --config examples/models/gpt2-124m.yaml --precision bf16 --steps 30 --warmup 10
baseline small-fp32 --config examples/models/gpt-small.yaml --precision fp32 --steps 100 --warmup 20
baseline gpt2-fp32 --config examples/models/gpt2-124m.yaml --precision fp32 --steps 20 --warmup 8

stage "report"
python3 bench/gpu/report.py "$RESULTS" | tee "$RESULTS/report.txt"
status=${PIPESTATUS[0]}
if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then
  tar -C "$(dirname "$RESULTS")" -czf "$OUT/kc-gpu-results.tgz" "$(basename "$RESULTS")"
fi
stage "done"
exit "$status"
