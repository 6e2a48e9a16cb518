#!/usr/bin/env bash
# The LM task's CUDA path on a GPU machine, in one go:
#   1. the CUDA tests (tests/test_lm_cuda.py) and the LM model tests;
#   2. one RLOO run of 200 iterations with device=cuda (SFT + reward model built on the GPU,
#      bf16 autocast), timed;
#   3. claim C10 at length: RLOO on the proxy reward for kl.beta in $BETAS and seeds in $SEEDS,
#      one process each, side by side on the GPU, with a token budget sized from step 2's
#      measured throughput to fit about $C10_SECONDS.
# Usage: RESULTS=results/gpu bash benchmarks/gpu_check.sh     (results and logs under $RESULTS)
set -uo pipefail
RESULTS=${RESULTS:-results/gpu}
BETAS=${BETAS:-"0 0.05 0.2"}
SEEDS=${SEEDS:-"0 1"}
C10_SECONDS=${C10_SECONDS:-240}
DEVICE=${DEVICE:-cuda}
EXTRA=${EXTRA:-}            # extra overrides for every run (a dry run on CPU uses tiny sizes here)
PY=${PYTHON:-python3}
mkdir -p "$RESULTS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"

echo "== 1. CUDA tests"
$PY -m pytest -q -p no:cacheprovider tests/test_lm_cuda.py tests/test_lm_model.py 2>&1 | tail -4

echo "== 2. RLOO, 200 iterations, device=$DEVICE"
start=$(date +%s)
$PY -m harness task=lm_summarize estimator=rloo seed=0 device=$DEVICE budget.iterations=200 eval_every=50 \
    results_dir="$RESULTS" progress=false $EXTRA 2>&1 | grep -v "^\[20" | tail -3
echo "200-iteration rloo run, pipeline build included: $(( $(date +%s) - start )) s"
TOKS=$($PY - "$RESULTS" <<'PY'
import glob, json, sys
import pandas as pd
[f] = glob.glob(f"{sys.argv[1]}/lm_summarize/rloo/seed0-*/metrics.parquet")
d = pd.read_parquet(f)
s = json.load(open(f.replace("metrics.parquet", "summary.json")))
print(f"{d.tokens.iloc[-1] / d.iter_time_s.sum():.0f}")
print(f"iterations {len(d)}, RL wall {s['wall_time_s']:.1f} s, {d.iter_time_s.mean():.3f} s/iteration, "
      f"eval_return {s['eval_return_init']:.3f} -> {d.eval_return.dropna().iloc[-1]:.3f}, "
      f"peak_mem_mb {d.peak_mem_mb.max():.0f}", file=sys.stderr)
PY
)
echo "measured: $TOKS sampled tokens/s (one run alone)"
[ -n "$TOKS" ] || { echo "step 2 failed: see $RESULTS/.hydra/runs/*/__main__.log"; grep -h -A40 Traceback "$RESULTS"/.hydra/runs/*/__main__.log | tail -40; exit 1; }

echo "== 3. C10: kl.beta in {$BETAS} x seed in {$SEEDS}, one process each"
N=$(( $(echo $BETAS | wc -w) * $(echo $SEEDS | wc -w) ))
BUDGET=$(( ${TOKS:-1000} * C10_SECONDS * 3 / 4 ))  # the N processes share the GPU and the host
echo "budget.tokens=$BUDGET per run"
for b in $BETAS; do for s in $SEEDS; do
  timeout $(( C10_SECONDS + 120 )) $PY -m harness task=lm_summarize estimator=rloo seed=$s device=$DEVICE \
      kl.beta=$b lm.kl_ref_every=1 budget.tokens=$BUDGET eval_every=25 results_dir="$RESULTS/c10" \
      lm.cache_dir="$RESULTS/.cache/lm" progress=false $EXTRA > "$RESULTS/c10_beta${b}_seed$s.log" 2>&1 &
done; done
wait
tail -qn 1 "$RESULTS"/c10_beta*.log
