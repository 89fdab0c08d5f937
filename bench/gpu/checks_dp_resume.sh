#!/usr/bin/env bash
# On a GPU machine, after run.sh unpacked the bundle: data parallelism over 2 ranks sharing the
# GPU gives the 1-rank losses, and a run killed after a checkpoint resumes with the losses of
# the run that was never killed (the StateTensors / RestoreProgress path of the CUDA trainer).
set -uo pipefail
cd "$(dirname "$0")/../.."
B=$(realpath -m "${1:-.gpu-bundle}")
LIBS=$(python3 -c "import glob,os;print(':'.join(sorted({os.path.dirname(f) for f in glob.glob('/opt/torch/.venv/lib/python3*/site-packages/nvidia/**/libcublas.so*',recursive=True)})))" 2>/dev/null)
export LD_LIBRARY_PATH="$B/lib:$LIBS:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
K="$B/bin/kc"; D="$B/data/fortunes/manifest.json"; R=/tmp/kc-gpu-checks; rm -rf "$R"; mkdir -p "$R"
common=(examples/models/gpt-small.yaml --device cuda --data "$D" --progress none --eval-every 0 --global-batch 8)
"$K" train "${common[@]}" --steps 20 --ranks 1 --out "$R/r1" >"$R/r1.txt" 2>&1; tail -n 3 "$R/r1.txt"
"$K" train "${common[@]}" --steps 20 --ranks 2 --out "$R/r2" >"$R/r2.txt" 2>&1; tail -n 3 "$R/r2.txt"
"$K" train "${common[@]}" --ranks 1 --out "$R/first" --checkpoint-dir "$R/ck" --steps 10 >"$R/first.txt" 2>&1; echo "first 10 steps: exit $?"
"$K" train "${common[@]}" --steps 20 --ranks 1 --out "$R/resumed" --checkpoint-dir "$R/ck" >"$R/resumed.txt" 2>&1; echo "resumed run exit $?"; grep -i "resum" "$R/resumed.txt" | head -3
python3 - "$R" <<'PY'
import json, sys
from pathlib import Path
R = Path(sys.argv[1])
def losses(name):
    out = {}
    for line in (R / name / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("type") == "step":
            out[r["step"]] = r["loss"]
    return out
one, two, res = losses("r1"), losses("r2"), losses("resumed")
dp = max(abs(two[s] - one[s]) / one[s] for s in one)
print(f"2 ranks vs 1 rank, steps 1-20: worst relative difference {dp:.2e}")
rs = max(abs(res[s] - one[s]) / one[s] for s in res)
print(f"resumed steps {min(res)}-{max(res)} vs the uninterrupted run: worst relative difference {rs:.2e}")
print("PASS" if dp < 1e-4 and rs < 1e-6 and min(res) == 11 else "FAIL")
PY
