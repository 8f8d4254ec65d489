#!/usr/bin/env bash
# The benchmarks of issues 4 and 5 on one CUDA GPU, as one prepared run.
#
#   benchmarks/gpu_check.sh OUT_DIR [SCALE]
#
# Stages, in order of priority, each bench in its own process under its own time limit so that
# one failure or overrun leaves the others' results: a one-item smoke pass of every method
# (which also times them), a cProfile of ViSpec and SJD-PAC decoding, then bench caption at
# T=0 and T=1 and bench t2i at batch 1 and batch 8 (bf16). Each full bench takes as many
# held-out images / prompts (up to the issues' 200) as its time budget allows by the smoke
# timings; SCALE (default 1.0) multiplies the budgets. JSON, plots, logs land in OUT_DIR.
# DEVICE=cpu runs the same on the CPU (a dry run: SCALE 0.05); PY names the python; PACK=FILE.tgz
# re-archives OUT_DIR after every stage; TUNE_WINDOWS overrides the windows --window auto tries.
set -u
out=${1:?usage: gpu_check.sh OUT_DIR [SCALE]}
scale=${2:-1.0}
py=${PY:-python3}
device=${DEVICE:-cuda}
windows=${TUNE_WINDOWS:-8,16,32,48,64,96}
mkdir -p "$out"

run() {  # run NAME SECONDS ARGS...: one bench under a time limit, its JSON as OUT_DIR/NAME.json
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "=== $name (limit ${limit}s): raydec bench $*"
  PYTHONUNBUFFERED=1 timeout "$limit" $py -m raydec.cli bench "$@" --device "$device" --json "$out/$name.json" 2>&1 \
    | tr '\r' '\n' | grep -av -e "it/s]" -e "s/it]" -e "Loading weights" > "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  grep -a -A12 -e "^bench " -e "Error" -e "error:" "$out/$name.log" | tail -n 30
  echo "=== $name: exit $rc after $((SECONDS - start))s"
  pack
}

pack() {  # PACK=FILE.tgz: everything so far in one archive (a device run returns few files)
  if [ -n "${PACK:-}" ]; then tar czf "$PACK" -C "$out" . 2>/dev/null; fi
}

fit() {  # fit SMOKE BUDGET_S MAX [STEP] [OVERHEAD] [COST]: items that fit the budget by SMOKE's timings
  # (OVERHEAD: smoke items' worth of fixed work such as tuning; COST: smoke items per item)
  $py - "$out/$1.json" "$2" "$3" "${4:-1}" "${5:-0}" "${6:-1}" "$scale" <<'PY'
import json, sys
path, budget, most, step, overhead, cost, scale = sys.argv[1], *map(float, sys.argv[2:])
try:
    data = json.load(open(path))
    items = data.get("images") or data.get("prompts") or 1
    per_item = sum(m["seconds"] for m in data["methods"].values()) / items
except (OSError, KeyError, ValueError):
    per_item = 10.0
n = int((budget * scale / max(per_item, 1e-3) - overhead) / cost // step * step)
print(int(min(most, max(step, n))))
PY
}

$py - <<'PY'
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY
run smoke_caption 90 caption --methods ar,hf_assisted,eagle,vispec --images 1
run smoke_t2i 90 t2i --methods ar,hf,sjd,sjd_ac,sjd_pac --prompts 1 --window 16 --plots "$out/plots_smoke"
echo "=== profile"
PYTHONUNBUFFERED=1 timeout 60 $py benchmarks/profile_decode.py --device "$device" --out "$out/profile" --top 25 \
  2>&1 | grep -av "Loading weights" > "$out/profile.log"; echo "=== profile: exit $?"; pack

n=$(fit smoke_caption 70 200); run caption_t0 150 caption --methods ar,hf_assisted,eagle,vispec --temperature 0 --images "$n"
n=$(fit smoke_caption 30 60); run caption_t1 80 caption --methods ar,hf_assisted,eagle,vispec --temperature 1 --images "$n"
# --window auto first decodes 4 calibration prompts (batch 8: 8) with each of ~31 draft shapes:
# about 20 smoke prompts' worth of work; a batch of 8 costs about 2 smoke prompts (guesses)
n=$(fit smoke_t2i 150 200 1 20); run t2i_b1 240 t2i --methods ar,hf,sjd,sjd_ac,sjd_pac --prompts "$n" --batch 1 --tune-windows "$windows" --plots "$out/plots_b1"
n=$(fit smoke_t2i 80 64 8 12 0.25); run t2i_b8 150 t2i --methods ar,sjd,sjd_ac,sjd_pac --prompts "$n" --batch 8 --tune-windows "$windows" --plots "$out/plots_b8"
echo "=== done"
