#!/usr/bin/env bash
# GPU truth (issue 30): multihost's GPU paths on this machine's real NVIDIA GPU(s), in
# local mode (no --ips, no sshd), every output kept in one folder, in at most 8 minutes.
#
#   bench/gpu_truth.sh [--dry-run] [OUT]      OUT: the argument, else $OUT, else
#                                             ./gpu-truth-<date>
#
#   1 nvidia-smi exactly as multihost calls it (check's queries, the run sampler's), with
#     a header naming the machine: OUT/nvidia-smi/, in the formats of the test data
#   2 check --gpus 0, and check --collective --gpus 0 (plain and --json)
#   3 run --gpus 0 --plain -- examples/train_ddp.py (NCCL): plain lines, gpu.log
#   4 a rank that allocates past the GPU's memory (bench/gpu_oom.py): the root cause
#   5 --gpus 0..N with N GPUs: the refusal and its exit code
#   6 stacks of a rank stuck in torch.cuda.synchronize (bench/gpu_stuck.py), then stop
#   OUT/summary.txt (and .json): each step, its exit codes, whether it met what was expected
#
# --dry-run: as on a machine without CUDA, with the lab's stand-in nvidia-smi first on
# PATH; steps that need CUDA are "skipped: no CUDA", rehearsed on the CPU where they can
# be. PYTHON runs multihost (default .venv/bin/python, else python3); JOB_PYTHON runs
# the ranks and needs torch (default PYTHON). Exit status 0 when nothing failed.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DRY=0 OUT_ARG=
for arg in "$@"; do
    case $arg in
        --dry-run) DRY=1 ;;
        -h|--help) sed -n '2,20p' "$0" | cut -c3-; exit 0 ;;
        -*) echo "gpu_truth.sh: unknown option $arg (try --help)" >&2; exit 2 ;;
        *) OUT_ARG=$arg ;;
    esac
done
OUT=${OUT_ARG:-${OUT:-./gpu-truth-$(date -u +%Y%m%d-%H%M%S)}}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    [ -x "$ROOT/.venv/bin/python" ] && PYTHON=$ROOT/.venv/bin/python
fi
JOB_PYTHON=${JOB_PYTHON:-$PYTHON}
export JOB_PYTHON   # the header asks it for torch
START=$(date +%s)
BUDGET=${GPU_TRUTH_BUDGET:-440}   # seconds for every step; then the stop and the summary
RESERVE=25                        # kept back for stopping the stuck rank
STUCK_RUN=

cd "$ROOT" || exit 2
MH=("$PYTHON" -m multihost)

# step NAME CAP COMMAND...: COMMAND under timeout (CAP, or what is left of the budget),
# its argv, stdout, stderr, exit code and seconds in OUT/NAME.*
step() {
    local name=$1 cap=$2 left; shift 2
    left=$(( START + BUDGET - $(date +%s) - RESERVE ))
    # The stuck rank is stopped whatever the time: a GPU left busy is worse than 8m05s.
    [ "$name" = 6-stop ] && left=$(( left + RESERVE < 30 ? 30 : left + RESERVE ))
    if [ "$left" -lt 5 ]; then
        echo "out of time" > "$OUT/$name.skipped"
        return 124
    fi
    [ "$cap" -gt "$left" ] && cap=$left
    printf '%q ' "$@" > "$OUT/$name.cmd"; echo >> "$OUT/$name.cmd"
    local began=$SECONDS rc
    timeout -k 5 "$cap" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err" < /dev/null
    rc=$?
    echo "$rc" > "$OUT/$name.rc"
    echo "$(( SECONDS - began ))" > "$OUT/$name.seconds"
    echo "gpu_truth: $name: exit $rc in $(( SECONDS - began ))s" >&2
    return "$rc"
}

run_id_of() { grep -oE '\b[0-9]{8}-[0-9]{6}-[0-9a-f]{4}\b' "$OUT/$1.err" 2>/dev/null | head -1; }

stop_stuck() {
    [ -n "$STUCK_RUN" ] || return 0
    step 6-stop 30 "${MH[@]}" stop "$STUCK_RUN" --kill-wait 3
    STUCK_RUN=
}
trap stop_stuck EXIT
trap 'exit 130' INT TERM

# The code the runs sync: the example and the small ranks of this script, nothing else.
mkdir -p "$OUT/code/examples"
cp "$ROOT/examples/train_ddp.py" "$OUT/code/examples/"
cp "$ROOT/bench/gpu_oom.py" "$ROOT/bench/gpu_stuck.py" "$OUT/code/"
JOB=(--python "$JOB_PYTHON" --code "$OUT/code" --log_dir "$OUT/log")

if [ "$DRY" = 1 ]; then
    # As the lab tests install it: the stand-in beside its replay file, first on PATH.
    mkdir -p "$OUT/standin"
    cp "$ROOT/tests/lab/nvidia_smi_standin.py" "$OUT/standin/nvidia-smi"
    cp "$ROOT/tests/unit/data/check/nvidia-smi-use-a100x8.csv" "$OUT/standin/replay.csv"
    chmod 755 "$OUT/standin/nvidia-smi"
    export PATH="$OUT/standin:$PATH"
    CUDA=0 COUNT=0
else
    read -r CUDA COUNT < <(timeout 120 "$JOB_PYTHON" -c 'import torch
print(int(torch.cuda.is_available()), torch.cuda.device_count())' 2>"$OUT/torch.err")
    CUDA=${CUDA:-0} COUNT=${COUNT:-0}
fi
echo "gpu_truth: into $OUT (cuda $CUDA, $COUNT GPU(s), dry run $DRY)" >&2

# 1: nvidia-smi as multihost calls it.
step 1-nvidia-smi 60 "$PYTHON" bench/gpu_truth.py record "$OUT/nvidia-smi"

# 2: check, plain and JSON, without and with the collective (one rank, NCCL).
if [ "$CUDA" = 1 ]; then
    step 2-check 45 "${MH[@]}" check --python "$JOB_PYTHON" --gpus 0 --plain -v
    step 2-check-json 45 "${MH[@]}" check --python "$JOB_PYTHON" --gpus 0 --json
    step 2-collective 90 "${MH[@]}" check --python "$JOB_PYTHON" --gpus 0 --collective --plain -v
    step 2-collective-json 90 "${MH[@]}" check --python "$JOB_PYTHON" --gpus 0 --collective --json
fi

# 3: a real DDP training on GPU 0, sampled every second. Without CUDA: the same run on
# the CPU (gloo), without the check (the stand-in answers only the sampler's query).
if [ "$CUDA" = 1 ]; then
    step 3-run 150 "${MH[@]}" run "${JOB[@]}" --gpus 0 --plain --gpu-interval 1 -- \
        examples/train_ddp.py --epochs 3 --steps 5000 --batch-size 256 --log-every 1000
else
    step 3-run 90 "${MH[@]}" run "${JOB[@]}" --gpus 0 --no-check --plain --gpu-interval 1 -- \
        examples/train_ddp.py --epochs 1 --steps 200 --log-every 50
fi
RUN3=$(run_id_of 3-run)
[ -n "$RUN3" ] && cat "$OUT/log/$RUN3"/*/gpu.log > "$OUT/3-gpu.log" 2>/dev/null
step 3-replay 30 "$PYTHON" bench/gpu_truth.py replay "$OUT/nvidia-smi" "$OUT/3-gpu.log"

# 4: a rank past its GPU's memory.
NO_CHECK=$([ "$CUDA" = 1 ] || echo --no-check)   # the stand-in answers no check
step 4-oom 90 "${MH[@]}" run "${JOB[@]}" --gpus 0 --plain $NO_CHECK -- gpu_oom.py

# 5: one GPU more than the machine has: refused before anything starts.
[ "$CUDA" = 1 ] || COUNT=1
GPUS=$(seq -s, 0 "$COUNT")
step 5-refusal 45 "${MH[@]}" run "${JOB[@]}" --gpus "$GPUS" --plain -- examples/train_ddp.py

# 6: a rank stuck in torch.cuda.synchronize: started detached, its stacks taken once it
# says it is there (and the GPU's queries recorded under that load), then stopped.
if step 6-run 60 "${MH[@]}" run "${JOB[@]}" --gpus 0 --detach --plain $NO_CHECK -- gpu_stuck.py
then
    STUCK_RUN=$(run_id_of 6-run)
fi
if [ -n "$STUCK_RUN" ]; then
    wait_until=$(( $(date +%s) + 90 ))
    last=$(( START + BUDGET - RESERVE - 60 ))   # leaves time for the stacks
    [ "$wait_until" -gt "$last" ] && wait_until=$last
    while [ "$(date +%s)" -lt "$wait_until" ]; do
        if timeout 20 "${MH[@]}" logs "$STUCK_RUN" --plain \
                --grep 'gpu_stuck: waiting' > "$OUT/6-marker.tmp" 2>/dev/null \
                && [ -s "$OUT/6-marker.tmp" ]; then
            mv "$OUT/6-marker.tmp" "$OUT/6-marker"
            break
        fi
        sleep 2
    done
    rm -f "$OUT/6-marker.tmp"
    [ "$CUDA" = 1 ] && step 6-load 30 "$PYTHON" bench/gpu_truth.py record "$OUT/nvidia-smi" --load
    step 6-stacks 45 "${MH[@]}" stacks "$STUCK_RUN"
    step 6-stacks-json 45 "${MH[@]}" stacks "$STUCK_RUN" --json
fi
stop_stuck

"$PYTHON" bench/gpu_truth_judge.py "$OUT" --cuda "$CUDA"
rc=$?
echo "gpu_truth: $(( $(date +%s) - START ))s; summary in $OUT/summary.txt" >&2
exit "$rc"
