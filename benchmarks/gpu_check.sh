#!/usr/bin/env bash
# The LM task's CUDA path on a GPU machine, in one go (issue 5):
#   1. the CUDA tests (tests/test_lm_cuda.py) and the LM model tests;
#   2. one default RL run with device=cuda (SFT + reward model built on the GPU, bf16 autocast);
#   3. claim C10 at length: RLOO on the proxy reward for kl.beta in $BETAS, side by side on the
#      GPU, with a token budget sized from step 2's measured throughput to fit $C10_SECONDS.
# Usage: RESULTS=results/gpu bash benchmarks/gpu_check.sh     (results and logs under $RESULTS)
set -uo pipefail
RESULTS=${RESULTS:-results/gpu}
BETAS=${BETAS:-"0 0.05 0.2"}
C10_SECONDS=${C10_SECONDS:-240}
PY=${PYTHON:-python3}
mkdir -p "$RESULTS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"

echo "== 1. CUDA tests"
$PY -m pytest -q -p no:cacheprovider tests/test_lm_cuda.py tests/test_lm_model.py 2>&1 | tail -4

echo "== 2. default run on cuda"
start=$(date +%s)
$PY -m harness task=lm_summarize estimator=rloo seed=0 device=cuda results_dir="$RESULTS" progress=false \
    2>&1 | grep -v "^\[" | tail -3
echo "default rloo run with pipeline build: $(( $(date +%s) - start )) s"
TOKS=$($PY - "$RESULTS" <<'PY'
import glob, sys
import pandas as pd
[f] = glob.glob(f"{sys.argv[1]}/lm_summarize/rloo/seed0-*/metrics.parquet")
d = pd.read_parquet(f)
print(f"{d.tokens.iloc[-1] / d.iter_time_s.sum():.0f}")
PY
)
echo "measured: $TOKS sampled tokens/s (one run alone)"

echo "== 3. C10: kl.beta in $BETAS side by side"
N=$(echo $BETAS | wc -w)
BUDGET=$(( TOKS * C10_SECONDS * 2 / (N + 1) ))  # N processes share the GPU and the host
echo "budget.tokens=$BUDGET per run"
for b in $BETAS; do
  timeout $(( C10_SECONDS * 2 )) $PY -m harness task=lm_summarize estimator=rloo seed=0 device=cuda kl.beta=$b budget.tokens=$BUDGET \
      eval_every=25 results_dir="$RESULTS/c10" lm.cache_dir="$RESULTS/.cache/lm" progress=false \
      > "$RESULTS/c10_beta$b.log" 2>&1 &
done
wait
tail -n 1 "$RESULTS"/c10_beta*.log
