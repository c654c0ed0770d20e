#!/usr/bin/env bash
# make gpu-check: everything a GPU machine can tell about fastasr, in one call of at most 8 minutes.
#
#   make gpu-check                      # on a machine with a GPU and torch, triton, lightning installed
#   make gpu-check PYTHON=python3.12    # another interpreter
#   GPU_CHECK_TRAIN=0 make gpu-check    # the kernel steps only (2-6), 5-8 minutes; summary in
#                                       # gpu_check_<gpu>_kernels.md
#   GPU_CHECK_BUDGET_S=570 make gpu-check  # another time budget for the whole check (seconds)
#   GPU_CHECK_KERNELS=step make gpu-check  # make train, then step/gpu.py's target columns alone (full,
#                                       # clustered-100, i-clustered-100 and the floor, eager and as CUDA
#                                       # graphs, N = 800 and 3,200), ~5.5 min; GPU_CHECK_TRAIN_MINUTES=2
#                                       # trains 2 minutes instead of 3
#   GPU_CHECK_TRAIN=0 GPU_CHECK_KERNELS=0 make gpu-check  # FSDD on the GPU alone (step 7, ~6.5 min;
#                                       # gpu_check_<gpu>_fsdd.md; with GPU_CHECK_TABLE2=1: Table 2,
#                                       # step 8, gpu_check_<gpu>_table2.md)
#
# Runs with the machine's own Python (no venv: a GPU image brings torch, triton and lightning); the
# project's other pure-Python dependencies are installed from wheels in .whl/ when that folder
# exists (docs/BENCHMARKS.md "GPU check" says which, and how to download them), then:
#   1. a 3-minute `make train` on the built-in corpus: synthesis, LM, training (bf16 mixed precision,
#      the machine's cores loading data), its greedy test and its final beam + LM decoding; the
#      summary gives train.py's own seconds (after the corpus and LM) and its last updates a second;
#   2. the Triton compile check (every kernel configuration for sm_90, spills reported; one
#      process a core);
#   3. the Triton tests, compiled on CUDA, the attention padding/inference-mode tests, and every
#      test marked `cuda` (those that need a GPU and skip in CI: pytest -m cuda), spread over up to
#      8 processes where pytest-xdist is installed (the time is the kernels' compiling);
#   4. step/gpu.py: the paper model's training step, each attention against the floor and full's
#      forced paths, the kernel switches' steps, and the steps captured as CUDA graphs;
#   5. attention/gpu_table.py, short: the kernels checked at bench sizes, then a timed sweep (bf16);
#      attention/full_paths.py: each exact path of padded full attention, and the one fastasr takes;
#      step/layer_norm_gpu.py: the model's layer norm by torch and by the Triton kernels (each backward
#      launch shape), and the host's time a call; gpu/launches.py: the aten and Triton launches and
#      host syncs of one encoder layer's training step, each attention, counted (training's batch);
#   6. the largest kernels of an i-clustered-100, a clustered-100 and the floor step; attention/clustering_gpu.py: no host synchronisation
#      in the clustered variants, K-means and each call timed, and clustered's with its centroid
#      values by the split-key kernels at every N (benchmarks/bench_io.py KERNEL_SWITCHES); then
#      gpu/decisions.py: what the candidates' timings decide by their rules (gpu_decisions_<gpu>.md);
#   7. where FSDD's recordings were carried (GPU_CHECK_FSDD, default data/fsdd_src: the folder
#      holding FSDD's recordings/, docs/BENCHMARKS.md "GPU check"): the recorded-speech recipe on
#      FSDD's speaker-disjoint split, the documented data=manifest command with a budget of
#      GPU_CHECK_FSDD_MINUTES (default 4) minutes, then its dev and test error.
#   8. with GPU_CHECK_TABLE2=1 (off by default): Table 2 of the paper on the GPU, the budget study
#      `budget=table2_frames` (full, clustered-100, i-clustered-100 at 6 layers, every frame reaching the
#      attention) in bf16, GPU_CHECK_TABLE2_SECONDS of training each (default: a third of what the
#      budget leaves less 150 s for the study's setup, at most 90; under 30 skips it) on the long built-in
#      corpus (built here: 41 s on 2 cores): time per epoch and its ratio to full's, the study's
#      budget.md as table2_frames_<gpu>.md. `GPU_CHECK_TRAIN=0 GPU_CHECK_KERNELS=0 GPU_CHECK_TABLE2=1
#      make gpu-check` runs it alone (~7 min).
# Training runs (1, 7, 8) capture their steps as CUDA graphs (`capture_steps=auto`); runs 1 and 8
# also time each Lightning action on the host (`+trainer.profiler=simple`, under 0.1 ms a step), which
# benchmarks/step/actions.py tabulates as actions_<gpu>_make_train.md and actions_<gpu>_table2_frames.md;
# GPU_CHECK_CAPTURE=false runs them eager, so two calls give the captured and the eager figures
# (docs/BENCHMARKS.md "GPU check"); the captured step's own tests are among step 3's `cuda` tests.
# With make train, attention/clustering_gpu.py has what is left of the budget (its first tables); the kernel
# steps alone (GPU_CHECK_TRAIN=0) leave it about 4 minutes.
# Each step has a time cap, cut to what is left of the whole check's budget (GPU_CHECK_BUDGET_S,
# default 480 s: 8 minutes, inside the 600 s a device call may run); a step with under 20 s left is
# skipped, and the benchmark scripts stop starting new rows 10 s before their cap
# ($BENCH_DEADLINE), so a step cut short still writes its tables. Each step's status goes into the
# summary; a failed step does not stop the others. Every table is written under benchmarks/results/
# with the GPU's name; the summary is benchmarks/results/gpu_check_<gpu>.md. Where $OUT is set (the
# device tool), the results are also packed into $OUT/gpu_check_results.tgz.
set -u
cd "$(dirname "$0")/../.."  # the repository root: the scripts run as `python -m benchmarks.<folder>.<script>`
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
RESULTS=benchmarks/results
mkdir -p "$RESULTS" outputs
LOG=outputs/gpu_check.log
: > "$LOG"
START=$SECONDS
BUDGET=${GPU_CHECK_BUDGET_S:-480}

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/fastasr-site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/fastasr-site" || echo "warning: installing .whl/ failed" | tee -a "$LOG"
fi
GPU=$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>>"$LOG")
if [ -z "$GPU" ]; then
  echo "make gpu-check: no CUDA GPU visible to $PY (torch.cuda.is_available() is False)" >&2
  exit 2
fi
# the commit every table names (bench_io.git_commit: +changes where tracked files differ from it)
FASTASR_COMMIT=$("$PY" -c 'from benchmarks import bench_io; print(bench_io.git_commit("."))')
export FASTASR_COMMIT
SLUG=$("$PY" -c 'import sys; from benchmarks import bench_io; print(bench_io.machine_slug(sys.argv[1]))' "$GPU")
TRAIN=${GPU_CHECK_TRAIN:-1}
STEPS=()
RUN=outputs/runs/gpu-check

step() {  # step NAME CAP_SECONDS COMMAND...: run with a time cap, record status and seconds
  local name=$1 cap=$2; shift 2
  local t0=$SECONDS
  local left=$((BUDGET - (SECONDS - START) - 15))  # 15 s kept for the summary and the results' tarball
  [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -lt 20 ]; then
    STEPS+=("| $name | skipped: the ${BUDGET} s budget is spent | 0 |")
    echo "=== $name: skipped, the ${BUDGET} s budget is spent" | tee -a "$LOG"
    return
  fi
  echo "=== $name (cap ${cap}s, at $((SECONDS - START))s)" | tee -a "$LOG"
  BENCH_DEADLINE=$(($(date +%s) + cap - 10)) timeout --kill-after=10 "$cap" "$@" 2>&1 | tee -a "$LOG" | tail -n 40
  local rc=${PIPESTATUS[0]}
  local status=ok
  [ "$rc" = 0 ] || status="FAILED (exit $rc$([ "$rc" = 124 ] && echo ': time cap'))"
  STEPS+=("| $name | $status | $((SECONDS - t0)) |")
  echo "=== $name: $status in $((SECONDS - t0))s" | tee -a "$LOG"
  save_out
}

save_out() {  # the device tool brings back what is under $OUT, also from a call cut short
  [ -n "${OUT:-}" ] || return 0
  cp "$LOG" "$OUT/" 2>/dev/null
  tar czf "$OUT/gpu_check_results.tgz" "$RESULTS"/*"$SLUG"* "$RUN"/*.json "$RUN"/*.yaml \
    outputs/runs/gpu-check-fsdd/*.json outputs/runs/gpu-check-fsdd/*.yaml outputs/runs/gpu-check-fsdd/train.log \
    "$TABLE2_DIR"/budget.* 2>/dev/null
  return 0
}

train_builtin() {
  "$PY" -m fastasr.cli.corpus synthetic --out data/synthetic --workers "$(nproc)" || return 1
  "$PY" -m fastasr.cli.lm build --manifest data/synthetic/train.jsonl --order 3 \
    --out data/synthetic/lm/words-3gram.arpa --dev data/synthetic/dev.jsonl || return 1
  rm -rf "$RUN"
  local t0=$SECONDS
  "$PY" train.py name=gpu-check logger=csv "trainer.max_time=00:00:$(printf %02d "$TRAIN_MINUTES"):00" \
    "capture_steps=$CAPTURE" +trainer.profiler=simple || return 1
  # the target's figure: train.py's wall time (fit, test, final decoding) once the corpus is built
  echo "make train on the GPU: train.py took $((SECONDS - t0)) s after the corpus and LM (capture_steps=$CAPTURE)"
  "$PY" -m benchmarks.step.actions "$RUN" --machine "$SLUG" --tag make_train >/dev/null \
    || echo "benchmarks.step.actions: no table of make train's actions"
}
export -f train_builtin
CAPTURE=${GPU_CHECK_CAPTURE:-auto}  # capture_steps of every training run here: auto (captured on a GPU) or false
TRAIN_MINUTES=${GPU_CHECK_TRAIN_MINUTES:-3}  # make train's trainer.max_time
export PY RUN CAPTURE TRAIN_MINUTES

FSDD_SRC=${GPU_CHECK_FSDD:-data/fsdd_src}
FSDD_RUN=outputs/runs/gpu-check-fsdd
FSDD_MINUTES=${GPU_CHECK_FSDD_MINUTES:-4}
# The documented command for a new corpus (README), its budget cut to FSDD_MINUTES; the final
# tuning's vocabulary is the training words alone: wordfreq's 50,000 frequent words come in a
# 57 MB wheel, which with FSDD's 27 MB would pass the device's 64 MiB carry, and FSDD's
# vocabulary is its ten digit words.
train_fsdd() {
  "$PY" -m fastasr.cli.corpus digits "$FSDD_SRC" data/fsdd_speakers --split speakers || return 1
  rm -rf "$FSDD_RUN"
  "$PY" train.py data=manifest tokenizer=char data.train_manifest=data/fsdd_speakers/train.jsonl \
    data.dev_manifest=data/fsdd_speakers/dev.jsonl data.test_manifest=data/fsdd_speakers/test.jsonl \
    name=gpu-check-fsdd logger=csv "trainer.max_time=00:00:$(printf %02d "$FSDD_MINUTES"):00" \
    "final_tuning.frequent_words=[0]" "capture_steps=$CAPTURE"
}
export -f train_fsdd
export FSDD_SRC FSDD_RUN FSDD_MINUTES

TABLE2=${GPU_CHECK_TABLE2:-0}
TABLE2_SECONDS=${GPU_CHECK_TABLE2_SECONDS:-}  # unset: what the budget leaves, at most 90 s a member
# the study's seconds besides the members' training: the corpus, each member's setup, validation
# and forward timing
TABLE2_OVERHEAD=150
TABLE2_DIR=outputs/budget/table2-frames-gpu
# Table 2 on the GPU: the long corpus as `make data-long` builds it, then the budget study's
# table2_frames members for TABLE2_SECONDS each in bf16, from scratch
table2_gpu() {
  [ -f data/synthetic_long/.complete ] || "$PY" -m fastasr.cli.corpus synthetic --out data/synthetic_long \
    --min-seconds 10 --max-seconds 40 --train 600 --dev 60 --test 60 --workers "$(nproc)" || return 1
  rm -rf "$TABLE2_DIR"
  "$PY" -m fastasr.cli.budget budget=table2_frames budget.name=table2-frames-gpu budget.wandb=disabled \
    "budget.max_time=00:00:$(printf %02d $((TABLE2_SECONDS / 60))):$(printf %02d $((TABLE2_SECONDS % 60)))" \
    "budget.extra_overrides=[\"trainer.precision=bf16-mixed\",\"logger=csv\",\"capture_steps=$CAPTURE\",\"+trainer.profiler=simple\"]" \
    || return 1
  cp "$TABLE2_DIR/budget.md" "$RESULTS/table2_frames_$SLUG.md"
  "$PY" -m benchmarks.step.actions "$TABLE2_DIR/budget.log" --machine "$SLUG" --tag table2_frames >/dev/null \
    || echo "benchmarks.step.actions: no table of Table 2's actions"
}
export -f table2_gpu
export TABLE2_SECONDS TABLE2_DIR RESULTS SLUG

CORES=$(nproc)
XDIST=()  # the compiled tests spread over processes where pytest-xdist is installed (the GPU image has it)
"$PY" -c "import xdist" 2>/dev/null && XDIST=(-n "$((CORES < 8 ? CORES : 8))")

KERNEL_STEPS=${GPU_CHECK_KERNELS:-1}
# the summary's name says what ran: the whole check, the kernel steps, Table 2 or FSDD alone
PART=""
if [ "$TRAIN" = 0 ]; then
  if [ "$KERNEL_STEPS" = step ]; then PART=_step; elif [ "$KERNEL_STEPS" != 0 ]; then PART=_kernels; elif [ "$TABLE2" != 0 ]; then PART=_table2; else PART=_fsdd; fi
fi
SUMMARY=$RESULTS/gpu_check_$SLUG$PART.md
[ "$TRAIN" = 0 ] || step "make train ($TRAIN_MINUTES min of training, test, beam + LM)" $((TRAIN_MINUTES * 60 + 120)) \
  bash -c train_builtin
if [ "$KERNEL_STEPS" = step ]; then  # the step's target columns alone: eager beside captured, each attention
  step "step/gpu.py (eager and as CUDA graphs)" 150 "$PY" -m benchmarks.step.gpu --variants full clustered-100 \
    i-clustered-100 floor "full, as CUDA graphs" "clustered-100, as CUDA graphs" "i-clustered-100, as CUDA graphs" \
    "floor, as CUDA graphs"
elif [ "$KERNEL_STEPS" != 0 ]; then
  step "Triton compile check (sm_90)" 60 "$PY" -m fastasr.cli.kernels compile-check --jobs "$CORES" --loops
  step "tests compiled on CUDA" 120 env TRITON_INTERPRET=0 "$PY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" \
    tests/test_kernels_triton.py tests/test_attention_padding.py
  step "tests that need a GPU (pytest -m cuda)" 120 env TRITON_INTERPRET=0 "$PY" -m pytest -q -p no:cacheprovider \
    "${XDIST[@]}" -m cuda tests/
  step "step/gpu.py (the paper model's step)" 150 "$PY" -m benchmarks.step.gpu
  step "attention/gpu_table.py (check, then a 30 s bf16 sweep)" 80 "$PY" -m benchmarks.attention.gpu_table --budget-s 30 \
    --dtypes bfloat16 --ns 1024 4096 16384 65536
  step "attention/full_paths.py (full attention's exact paths)" 90 "$PY" -m benchmarks.attention.full_paths
  step "step/layer_norm_gpu.py (the layer norm's kernels and host time)" 40 "$PY" -m benchmarks.step.layer_norm_gpu
  step "gpu/launches.py (launches and host syncs a layer, counted)" 45 "$PY" -m benchmarks.gpu.launches --batch 80
  step "step/gpu.py --profile (i-clustered-100, clustered-100, floor)" 50 "$PY" -m benchmarks.step.gpu --lengths 800 \
    --profile i-clustered-100 clustered-100 floor
  step "attention/clustering_gpu.py (no host sync, K-means, each call)" 270 "$PY" -m benchmarks.attention.clustering_gpu --topk-tiles 4:8 1:1 --kmeans-stages 1 --tiles 32:4:128 64:4:168 --sparse-tiles 16:4 16:2 32:4 64:8 --centroid-bwd-tiles 64:8 32:4 32:8
  # the candidates' verdicts by their rules (no GPU, a second): outside `step`, so a spent budget keeps them
  "$PY" -m benchmarks.gpu.decisions --gpu "$SLUG" 2>&1 | tee -a "$LOG"
fi
if [ -d "$FSDD_SRC/recordings" ]; then
  # the budget, then the final tuning on dev and the beam + LM decoding of the best-5 mean
  step "FSDD speaker-disjoint, the recorded-speech recipe ($FSDD_MINUTES min)" $((FSDD_MINUTES * 60 + 150)) bash -c train_fsdd
else
  STEPS+=("| FSDD speaker-disjoint | skipped: no $FSDD_SRC/recordings (carry FSDD's recordings/ there) | 0 |")
fi
if [ "$TABLE2" != 0 ]; then
  if [ -z "$TABLE2_SECONDS" ]; then  # a third of what the steps before left, less the study's overhead
    TABLE2_SECONDS=$(((BUDGET - (SECONDS - START) - 15 - TABLE2_OVERHEAD) / 3))
    [ "$TABLE2_SECONDS" -gt 90 ] && TABLE2_SECONDS=90
  fi
  if [ "$TABLE2_SECONDS" -lt 30 ]; then
    STEPS+=("| Table 2 on the GPU | skipped: under 30 s of training a member left of the ${BUDGET} s budget | 0 |")
    echo "=== Table 2 on the GPU: skipped, under 30 s of training a member left" | tee -a "$LOG"
  else
    step "Table 2 on the GPU (budget=table2_frames, ${TABLE2_SECONDS} s a member, bf16)" \
      $((3 * TABLE2_SECONDS + TABLE2_OVERHEAD + 90)) bash -c table2_gpu
  fi
fi

{
  echo "# make gpu-check: $GPU"
  echo
  echo "$(date -u +%F), commit $FASTASR_COMMIT, $("$PY" -c 'import torch, triton; print(f"torch {torch.__version__}, triton {triton.__version__}")'), $(nproc) CPU cores; $((SECONDS - START)) s in all (budget ${BUDGET} s)."
  echo
  echo "| step | status | seconds |"
  echo "|---|---|---:|"
  printf '%s\n' "${STEPS[@]}"
  echo
  if [ "$TRAIN" != 0 ]; then
    echo "## make train on the GPU (outputs/runs/gpu-check)"
    echo
    echo '```'
    grep -E "^test(:|, )|^Time limit|^GPU available|^Using bfloat16|Precision |^make train on the GPU: " "$LOG" | tail -n 9
    grep -E "updates/s" "$LOG" | tail -n 1
    [ -f "$RUN/fit_done.json" ] && cat "$RUN/fit_done.json"
    echo '```'
    echo
    [ -f "$RESULTS/actions_${SLUG}_make_train.md" ] && sed -n '/^| action /,/^$/p' "$RESULTS/actions_${SLUG}_make_train.md"
  fi
  if [ -f "$FSDD_RUN/train.log" ]; then
    echo "## FSDD speaker-disjoint on the GPU ($FSDD_RUN): the last validations, the test"
    echo
    echo '```'
    grep -E "epoch_summary|^test|test(:|, )" "$FSDD_RUN/train.log" | sed -E 's/^\[[^]]*\]\[[^]]*\]\[INFO\] - //' | tail -n 8
    [ -f "$FSDD_RUN/fit_done.json" ] && cat "$FSDD_RUN/fit_done.json"
    echo '```'
    echo
  fi
  if [ -f "$RESULTS/table2_frames_$SLUG.md" ] && [ "$TABLE2" != 0 ]; then
    echo "## Table 2 on the GPU ($TABLE2_DIR)"
    echo
    cat "$RESULTS/table2_frames_$SLUG.md"
    echo
    [ -f "$RESULTS/actions_${SLUG}_table2_frames.md" ] && sed -n '/^| action /,/^$/p' "$RESULTS/actions_${SLUG}_table2_frames.md"
  elif [ "$TABLE2" != 0 ] && [ -f "$TABLE2_DIR/budget.csv" ]; then
    echo "## Table 2 on the GPU, cut short: the members it finished ($TABLE2_DIR/budget.csv)"
    echo
    echo '```'
    cat "$TABLE2_DIR/budget.csv"
    echo '```'
    echo
  fi
  if [ "$KERNEL_STEPS" = step ] && [ -f "$RESULTS/gpu_step_$SLUG.md" ]; then
    echo "## The paper model's step, eager and captured (gpu_step_$SLUG.md)"
    echo
    sed -n '/^| N /,/^$/p' "$RESULTS/gpu_step_$SLUG.md"
    echo
  elif [ "$KERNEL_STEPS" != 0 ] && [ -f "$RESULTS/gpu_decisions_$SLUG.md" ]; then
    echo "## What the kernel tables decide (gpu_decisions_$SLUG.md)"
    echo
    sed -n '/^## What changes/,/^## Every candidate/p' "$RESULTS/gpu_decisions_$SLUG.md" | sed '1,2d;$d'
    echo
  fi
  echo "Tables: gpu_bench: \`gpu_$SLUG.md\`; full attention's paths: \`full_paths_$SLUG.md\`; the layer norm: \`layer_norm_$SLUG.md\`; launches and host syncs a layer: \`launches_$SLUG.md\`; the model step: \`gpu_step_$SLUG.md\`, its profile \`gpu_step_profile_$SLUG.txt\`; the clustering step: \`clustering_$SLUG.md\`; the whole log: outputs/gpu_check.log."
} > "$SUMMARY"
cat "$SUMMARY"
save_out
grep -q FAILED "$SUMMARY" && exit 1 || exit 0
