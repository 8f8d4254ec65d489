#!/usr/bin/env bash
# The GPU benchmarks (text-to-image, captioning, the device-native step) on one CUDA GPU, as one prepared run.
#
#   benchmarks/gpu_check.sh OUT_DIR [SCALE]
#
# Stages, in order of priority, each bench in its own process under its own time limit, so one
# failure or overrun leaves the others' results: bench step (the decode step outside the target
# forward at Janus-Pro's sizes: syncs, bytes to host, ops, launches, ms; then captured against eager), bench engine on a random model of
# Janus-Pro-7B's language model with an oracle drafter (known compression: its engine_efficiency
# = speedup / (compression / window forward cost) says what the step's own work leaves of the
# gain), bench caption at T=0, bench t2i at batch 1, bench caption at T=1, bench t2i at batch 8
# (all bf16), bench engine (a 60M random Llama: our AR vs HF generate, and an oracle drafter's
# ceiling), then a cProfile of ViSpec and SJD-PAC decoding. Each bench asks for the full counts (200 images / prompts) and stops taking
# new ones at its --max-seconds budget (every method finishes the same items); SCALE (default
# 1.0) multiplies the budgets. JSON, plots and logs land in OUT_DIR.
#   DEVICE=cpu           run the same on the CPU (a dry run: SCALE 0.05)
#   PY=python            the python that has raydec's requirements (default python3)
#   PACK=FILE.tgz        re-archive OUT_DIR after every stage (a device run returns few files)
#   TUNE_WINDOWS=16,32   windows --window auto tries (default 16,32,64,96: wide windows are
#                        cheap on a GPU; fewer shapes keep tuning short)
#   LIMIT_SCALE=0.5      multiplies each stage's hard time limit (default 1.0; the whole run's
#                        limits add up to 2370 s at 1.0), to fit a short device lease
#   STAGES="step engine_7b"  run only these stages (default: all; names as in OUT_DIR/NAME.json:
#                        host_work step step_context engine_7b step_captured engine_7b_captured step_qwen_vispec
#                        attention caption_t0 t2i_b1
#                        caption_t1 t2i_b8 throughput_t2i
#                        throughput_caption engine profile)
#   THROUGHPUT_BATCHES=1,8,32,64  the batch sizes of the throughput stages (the frontier; default
#                        1,8,32,64 on a GPU, 1,2 on the CPU)
#   ENGINE_SIZE=small    the engine_7b stage's model (default janus-pro-7b on a GPU, small on the CPU)
#   OLD_RAYDEC=DIR       a folder holding an earlier raydec package (e.g. a git worktree of the
#                        commit 4003d24, before the device-native step): stage host_work times benchmarks/host_work.py
#                        (sjd_pac, 16,384 codes, CFG, batch 8, window 64) new / old / new / old
#   HW_THREADS=4         torch threads of the host_work stage
#   STEP_ARGS="..."      bench step's grid (default: its own full grid on a GPU)
#   DRAIN=1              after the batch-8 stage, the same with --batching consecutive: the
#                        draining-batch baseline continuous batching replaces (limit 240 s more)
set -u
out=${1:?usage: gpu_check.sh OUT_DIR [SCALE]}
scale=${2:-1.0}
py=${PY:-python3}
device=${DEVICE:-cuda}
windows=${TUNE_WINDOWS:-16,32,64,96}
limit_scale=${LIMIT_SCALE:-1.0}
mkdir -p "$out"
# raydec from this checkout, installed or not (a device machine gets the tree, not the venv)
export PYTHONPATH="$(cd "$(dirname "$0")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}"

pack() {
  if [ -n "${PACK:-}" ]; then tar czf "$PACK" -C "$out" . 2>/dev/null; fi
}

seconds() { $py -c "print(round($1 * $scale, 3))"; }

stages=${STAGES:-host_work step step_context engine_7b step_captured engine_7b_captured step_qwen_vispec attention caption_t0 t2i_b1 caption_t1 t2i_b8 t2i_b8_drain throughput_t2i throughput_caption engine profile}
engine_size=${ENGINE_SIZE:-$([ "$device" = cpu ] && echo small || echo janus-pro-7b)}
wanted() { case " $stages " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

run() {  # run NAME LIMIT_S ARGS...: one bench under a time limit, its JSON as OUT_DIR/NAME.json
  wanted "$1" || return 0
  local name=$1 limit; limit=$($py -c "print(max(10, round($2 * $limit_scale)))"); shift 2
  local start=$SECONDS
  echo "=== $name (limit ${limit}s): raydec bench $*"
  PYTHONUNBUFFERED=1 timeout "$limit" $py -m raydec.cli bench "$@" --device "$device" --json "$out/$name.json" 2>&1 \
    | tr '\r' '\n' | grep -av -e "it/s]" -e "s/it]" -e "Loading weights" > "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  grep -a -A12 -e "^bench " -e "Error" -e "error:" -e "stopping after" "$out/$name.log" | tail -n 30
  echo "=== $name: exit $rc after $((SECONDS - start))s"
  pack
}

$py - <<'PY'
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY
if wanted host_work && [ -n "${OLD_RAYDEC:-}" ]; then
  echo "=== host_work: benchmarks/host_work.py, this checkout against $OLD_RAYDEC"
  hw_limit=$($py -c "print(max(10, round(150 * $limit_scale)))")
  for round in 1 2; do
    for side in new old; do
      if [ $side = old ]; then path=$OLD_RAYDEC; else path=$(cd "$(dirname "$0")/.." && pwd); fi
      PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}" timeout "$hw_limit" $py "$(dirname "$0")/host_work.py" --codebook 16384 \
        --batch 8 --window 64 --method sjd_pac --repeats 3 --threads "${HW_THREADS:-4}" --device "$device" \
        --json "$out/host_work_${side}_$round.json" 2>&1 | grep -av -e "Loading weights" -e "Writing model" > "$out/host_work_${side}_$round.log"
      tail -n 2 "$out/host_work_${side}_$round.log"
    done
  done
  pack
fi
if [ "$device" = cpu ]; then step_grid=(--vocab 16384 --batch 1,8 --window 16,64 --steps 1); else step_grid=(); fi
[ -n "${STEP_ARGS:-}" ] && read -r -a step_grid <<< "$STEP_ARGS"
run step 180 step --threads 0 "${step_grid[@]}"
# the cache written in place against concatenation at long context: bytes per step and forward ms, per device
if [ "$device" = cpu ]; then ctx_grid=(--context 64,256 --steps 1); else ctx_grid=(--context 256,1024,4096); fi
run step_context 180 step --threads 0 --methods sjd_pac,eagle --vocab 16384 --batch 8 --window 16 --cache-layout slots,concat \
  "${ctx_grid[@]}"
run engine_7b 300 engine --size "$engine_size" --prompts 3 --new-tokens 256 --window 16 --dtype bfloat16
# the step captured (CUDA graphs per batch bucket) against eager: launches and ms outside the forward, then the 7B oracle
if [ "$device" = cpu ]; then cap_grid=(--vocab 16384 --batch 1,8 --window 16 --steps 1); else cap_grid=(--vocab 16384 --batch 1,8,32 --window 16,64); fi
run step_captured 300 step --threads 0 --compile off,on "${cap_grid[@]}"
if [ "$device" = cpu ]; then cap_engine=(--prompts 1 --new-tokens 32); else cap_engine=(--prompts 3 --new-tokens 256); fi
run engine_7b_captured 300 engine --size "$engine_size" "${cap_engine[@]}" --window 16 --dtype bfloat16 --compile on
# ViSpec's step at Qwen2.5-VL-7B's size (its language model, random weights, and a draft at its width), eager and
# captured: ms outside the forward, launches, and the whole step in target-forward times (step_over_forward)
if [ "$device" = cpu ]; then vispec_grid=(--tree-target qwen2.5-vl-small --batch 1,8 --window 16 --steps 1); else vispec_grid=(--tree-target qwen2.5-vl-7b --batch 1,8 --window 16,64); fi
run step_qwen_vispec 300 step --threads 0 --methods eagle --compile off,on "${vispec_grid[@]}"
# one layer's window attention at Qwen2.5-VL-7B's heads over a ragged cache: K/V repeated (Hugging Face's path with a mask),
# ours (window_attention), and FlexAttention with a BlockMask, ms per call at 256-4,096 cached slots
wanted attention && { echo "=== attention: benchmarks/window_attention.py"
  if [ "$device" = cpu ]; then att=(--contexts 256 --windows 16 --repeats 2); else att=(); fi
  PYTHONUNBUFFERED=1 timeout "$($py -c "print(max(10, round(120 * $limit_scale)))")" $py "$(dirname "$0")/window_attention.py" \
    --device "$device" "${att[@]}" --json "$out/attention.json" > "$out/attention.log" 2>&1
  echo "=== attention: exit $?"; tail -n 8 "$out/attention.log"; pack; }
run caption_t0 240 caption --methods ar,hf_assisted,eagle,vispec --temperature 0 --images 200 --max-seconds "$(seconds 100)"
run t2i_b1 360 t2i --methods ar,hf,sjd,sjd_ac,sjd_pac --prompts 200 --batch 1 --tune-windows "$windows" \
  --max-seconds "$(seconds 150)" --plots "$out/plots_b1"
run caption_t1 120 caption --methods ar,hf_assisted,eagle,vispec --temperature 1 --images 60 --max-seconds "$(seconds 40)"
run t2i_b8 240 t2i --methods ar,sjd,sjd_ac,sjd_pac --prompts 128 --batch 8 --chunk 64 --tune-windows "$windows" \
  --max-seconds "$(seconds 60)" --plots "$out/plots_b8"  # chunks of 64: less of the time is a chunk's drain
if [ "${DRAIN:-0}" = 1 ]; then
  run t2i_b8_drain 240 t2i --methods ar,sjd,sjd_ac,sjd_pac --prompts 128 --batch 8 --chunk 64 --tune-windows "$windows" \
    --batching consecutive --max-seconds "$(seconds 60)"
fi
if [ "$device" = cpu ]; then tp=(--batches "${THROUGHPUT_BATCHES:-1,2}" --items 2 --calibration 2 --rounds 1 --repeats 1)
else tp=(--batches "${THROUGHPUT_BATCHES:-1,8,32,64}" --items 64 --calibration 16 --rounds 2); fi
run throughput_t2i 240 throughput --task t2i "${tp[@]}" --plots "$out/plots_throughput"
run throughput_caption 180 throughput --task caption "${tp[@]}" --max-new-tokens 64 --plots "$out/plots_throughput"
run engine 120 engine --prompts 6 --new-tokens 128
wanted profile && { echo "=== profile"
PYTHONUNBUFFERED=1 timeout "$($py -c "print(max(10, round(90 * $limit_scale)))")" $py benchmarks/profile_decode.py --device "$device" --out "$out/profile" --top 25 \
  2>&1 | grep -av "Loading weights" > "$out/profile.log"; echo "=== profile: exit $?"; pack; }
echo "=== done"
