#!/usr/bin/env bash
# The GPU benchmarks on one CUDA GPU, as one prepared run.
#
#   benchmarks/gpu_check.sh OUT_DIR [SCALE]
#
# Each stage is one bench in its own process under its own time limit, so one failure or overrun
# leaves the others' results. The default stages fit one device call: their limits add up to 540 s,
# most informative first:
#   step_captured       bench step at batch 8, Janus-Pro's codebook: launches and ms outside the
#                       forward, eager against captured, and each shape's compile seconds (80 s)
#   engine_7b_captured  bench engine on a random model of Janus-Pro-7B's language model with an oracle
#                       drafter, captured: engine_efficiency = speedup / (compression / window
#                       forward cost), what the step's own work leaves of the gain (140 s)
#   t2i_b1, t2i_b8      bench t2i: sjd, sjd_ac, sjd_pac against AR at batches 1 and 8 (60 s each)
#   caption_t1, caption_b8  bench caption: eagle, vispec against AR at T=1, batches 1 and 8 (40 s each)
#   throughput_t2i, throughput_caption  the frontier: items/s at batches 1, 8, 32, 64, AR and each
#                       method's tuned shape (70 s, 50 s)
# More stages, by name through STAGES: host_work step step_context engine_7b step_qwen_vispec
# attention caption_t0 t2i_b8_drain engine profile check_7b.
#   check_7b            raydec check: sjd_pac against AR on a random Janus with Janus-Pro-7B's language
#                       model (benchmarks/random_janus.py), bfloat16, 8 rows at batch 8: rows identical,
#                       each difference a near-tie or not (exit 1), speed (120 s to build, 420 s to check)
# Each bench asks for the full counts (200 images / prompts) and stops taking new ones at its
# --max-seconds budget (every method finishes the same items); SCALE (default 1.0) multiplies the
# budgets. JSON, plots and logs land in OUT_DIR.
#   DEVICE=cpu           run the same on the CPU (a dry run: SCALE 0.05)
#   PLAN=1               print each selected stage's limit and command, run nothing
#   PY=python            the python that has raydec's requirements (default python3)
#   PACK=FILE.tgz        re-archive OUT_DIR after every stage (a device run returns few files)
#   TUNE_WINDOWS=16,32   windows --window auto tries (default 16,32,64,96: wide windows are
#                        cheap on a GPU; fewer shapes keep tuning short)
#   LIMIT_SCALE=0.5      multiplies each stage's hard time limit (default 1.0), to fit a short lease
#   STAGES="step engine_7b"  run only these stages (default: the list above; names as in OUT_DIR/NAME.json)
#   THROUGHPUT_BATCHES=1,8,32,64  the batch sizes of the throughput stages (the frontier; default
#                        1,8,32,64 on a GPU, 1,2 on the CPU)
#   ENGINE_SIZE=small    the engine stages' model (default janus-pro-7b on a GPU, small on the CPU)
#   OLD_RAYDEC=DIR       a folder holding an earlier raydec package (e.g. a git worktree of the
#                        commit 4003d24, before the device-native step): stage host_work times benchmarks/host_work.py
#                        (sjd_pac, 16,384 codes, CFG, batch 8, window 64) new / old / new / old
#   HW_THREADS=4         torch threads of the host_work stage
#   STEP_ARGS="..."      the step stage's grid (default: its own full grid on a GPU)
#   CHECK_DIR=DIR        where check_7b writes its random checkpoint (default: $TMPDIR or /tmp; ~14 GB at 7B)
#   DRAIN=1              with stage t2i_b8_drain: the batch-8 stage with --batching consecutive, the
#                        draining-batch baseline continuous batching replaces
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

default_stages="step_captured engine_7b_captured t2i_b1 t2i_b8 caption_t1 caption_b8 throughput_t2i throughput_caption"
stages=${STAGES:-$default_stages}
engine_size=${ENGINE_SIZE:-$([ "$device" = cpu ] && echo small || echo janus-pro-7b)}
wanted() { case " $stages " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

run() {  # run NAME LIMIT_S ARGS...: one bench under a time limit, its JSON as OUT_DIR/NAME.json
  wanted "$1" || return 0
  local name=$1 limit; limit=$($py -c "print(max(10, round($2 * $limit_scale)))"); shift 2
  if [ -n "${PLAN:-}" ]; then echo "plan $name $limit raydec bench $* --device $device --json $out/$name.json"; return 0; fi
  local start=$SECONDS
  echo "=== $name (limit ${limit}s): raydec bench $*"
  PYTHONUNBUFFERED=1 timeout "$limit" $py -m raydec.cli bench "$@" --device "$device" --json "$out/$name.json" 2>&1 \
    | tr '\r' '\n' | grep -av -e "it/s]" -e "s/it]" -e "Loading weights" > "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  grep -a -A12 -e "^bench " -e "Error" -e "error:" -e "stopping after" "$out/$name.log" | tail -n 30
  echo "=== $name: exit $rc after $((SECONDS - start))s"
  pack
}

[ -n "${PLAN:-}" ] || $py - <<'PY'
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY
cpu() { [ "$device" = cpu ]; }

# -- the default stages, most informative first (limits: 80 + 140 + 60 + 60 + 40 + 40 + 70 + 50 = 540 s) --
# the step captured against eager at batch 8: launches and ms outside the forward, compile seconds per shape
if cpu; then cap_grid=(--methods sjd_pac --vocab 512 --batch 2 --window 8 --steps 1); else cap_grid=(--methods sjd_pac,eagle --vocab 16384 --batch 8 --window 16); fi
run step_captured 80 step --threads 0 --compile off,on "${cap_grid[@]}"
if cpu; then cap_engine=(--prompts 1 --new-tokens 32); else cap_engine=(--prompts 3 --new-tokens 256); fi
run engine_7b_captured 140 engine --size "$engine_size" "${cap_engine[@]}" --window 16 --dtype bfloat16 --compile on
run t2i_b1 60 t2i --methods ar,sjd,sjd_ac,sjd_pac --prompts 200 --batch 1 --tune-windows "$windows" \
  --max-seconds "$(seconds 30)" --plots "$out/plots_b1"
run t2i_b8 60 t2i --methods ar,sjd,sjd_ac,sjd_pac --prompts 128 --batch 8 --chunk 64 --tune-windows "$windows" \
  --max-seconds "$(seconds 30)" --plots "$out/plots_b8"  # chunks of 64: less of the time is a chunk's drain
run caption_t1 40 caption --methods ar,eagle,vispec --temperature 1 --images 60 --max-seconds "$(seconds 20)"
run caption_b8 40 caption --methods ar,eagle,vispec --temperature 1 --images 64 --batch 8 --max-seconds "$(seconds 20)"
if cpu; then tp=(--batches "${THROUGHPUT_BATCHES:-1,2}" --items 2 --calibration 2 --rounds 1 --repeats 1)
else tp=(--batches "${THROUGHPUT_BATCHES:-1,8,32,64}" --items 64 --calibration 16 --rounds 2); fi
run throughput_t2i 70 throughput --task t2i "${tp[@]}" --shapes tuned --plots "$out/plots_throughput"
run throughput_caption 50 throughput --task caption "${tp[@]}" --shapes tuned --max-new-tokens 64 --plots "$out/plots_throughput"

# -- more, by name through STAGES --
if wanted host_work && [ -n "${OLD_RAYDEC:-}" ]; then
  echo "=== host_work: benchmarks/host_work.py, this checkout against $OLD_RAYDEC"
  hw_limit=$($py -c "print(max(10, round(150 * $limit_scale)))")
  [ -n "${PLAN:-}" ] && echo "plan host_work $((4 * hw_limit)) benchmarks/host_work.py (4 runs)"
  for round in 1 2; do
    [ -n "${PLAN:-}" ] && break
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
if cpu; then step_grid=(--vocab 16384 --batch 1,8 --window 16,64 --steps 1); else step_grid=(); fi
[ -n "${STEP_ARGS:-}" ] && read -r -a step_grid <<< "$STEP_ARGS"
run step 180 step --threads 0 "${step_grid[@]}"
# the cache written in place against concatenation at long context: bytes per step and forward ms, per device
if cpu; then ctx_grid=(--context 64,256 --steps 1); else ctx_grid=(--context 256,1024,4096); fi
run step_context 180 step --threads 0 --methods sjd_pac,eagle --vocab 16384 --batch 8 --window 16 --cache-layout slots,concat \
  "${ctx_grid[@]}"
run engine_7b 300 engine --size "$engine_size" --prompts 3 --new-tokens 256 --window 16 --dtype bfloat16
# ViSpec's step at Qwen2.5-VL-7B's size (its language model, random weights, and a draft at its width), eager and
# captured: ms outside the forward, launches, and the whole step in target-forward times (step_over_forward)
if cpu; then vispec_grid=(--tree-target qwen2.5-vl-small --batch 1,8 --window 16 --steps 1); else vispec_grid=(--tree-target qwen2.5-vl-7b --batch 1,8 --window 16,64); fi
run step_qwen_vispec 300 step --threads 0 --methods eagle --compile off,on "${vispec_grid[@]}"
# one layer's window attention at Qwen2.5-VL-7B's heads over a ragged cache: K/V repeated (Hugging Face's path with a mask),
# ours (window_attention), and FlexAttention with a BlockMask, ms per call at 256-4,096 cached slots
if wanted attention; then
  att_limit=$($py -c "print(max(10, round(120 * $limit_scale)))")
  if [ -n "${PLAN:-}" ]; then echo "plan attention $att_limit benchmarks/window_attention.py"
  else
    echo "=== attention: benchmarks/window_attention.py"
    if cpu; then att=(--contexts 256 --windows 16 --repeats 2); else att=(); fi
    PYTHONUNBUFFERED=1 timeout "$att_limit" $py "$(dirname "$0")/window_attention.py" \
      --device "$device" "${att[@]}" --json "$out/attention.json" > "$out/attention.log" 2>&1
    echo "=== attention: exit $?"; tail -n 8 "$out/attention.log"; pack
  fi
fi
run caption_t0 240 caption --methods ar,hf_assisted,eagle,vispec --temperature 0 --images 200 --max-seconds "$(seconds 100)"
if [ "${DRAIN:-0}" = 1 ]; then
  run t2i_b8_drain 240 t2i --methods ar,sjd,sjd_ac,sjd_pac --prompts 128 --batch 8 --chunk 64 --tune-windows "$windows" \
    --batching consecutive --max-seconds "$(seconds 60)"
fi
run engine 120 engine --prompts 6 --new-tokens 128
if wanted profile; then
  prof_limit=$($py -c "print(max(10, round(90 * $limit_scale)))")
  if [ -n "${PLAN:-}" ]; then echo "plan profile $prof_limit benchmarks/profile_decode.py"
  else
    echo "=== profile"
    PYTHONUNBUFFERED=1 timeout "$prof_limit" $py benchmarks/profile_decode.py --device "$device" --out "$out/profile" --top 25 \
      2>&1 | grep -av "Loading weights" > "$out/profile.log"; echo "=== profile: exit $?"; pack
  fi
fi
# raydec check on a 7B-shaped Janus in bfloat16: every row of sjd_pac is AR's, or differs at a numeric near-tie
if wanted check_7b; then
  build_limit=$($py -c "print(max(10, round(120 * $limit_scale)))")
  check_limit=$($py -c "print(max(10, round(420 * $limit_scale)))")
  ckpt=${CHECK_DIR:-${TMPDIR:-/tmp}}/raydec_random_janus_$engine_size
  if cpu; then build=(--codebook 1024); rows=(--rows 2 --batch-size 2); else build=(); rows=(--rows 8 --batch-size 8); fi
  if [ -n "${PLAN:-}" ]; then echo "plan check_7b $build_limit benchmarks/random_janus.py --size $engine_size, then $check_limit raydec check"
  else
    echo "=== check_7b: benchmarks/random_janus.py --size $engine_size, then raydec check --method sjd_pac --dtype bfloat16"
    PYTHONUNBUFFERED=1 timeout "$build_limit" $py "$(dirname "$0")/random_janus.py" --size "$engine_size" --device "$device" \
      --dtype bfloat16 --out "$ckpt" "${build[@]}" 2>&1 | grep -av -e "it/s]" -e "Writing model" > "$out/check_7b.log"
    PYTHONUNBUFFERED=1 timeout "$check_limit" $py -m raydec.cli check --model "$ckpt" --method sjd_pac --dtype bfloat16 \
      --device "$device" "${rows[@]}" --json "$out/check_7b.json" 2>&1 | tr '\r' '\n' \
      | grep -av -e "it/s]" -e "s/it]" -e "image/s]" -e "s/image]" -e "Loading weights" >> "$out/check_7b.log"
    echo "=== check_7b: exit ${PIPESTATUS[0]}"; tail -n 16 "$out/check_7b.log"; pack
  fi
fi
echo "=== done"
