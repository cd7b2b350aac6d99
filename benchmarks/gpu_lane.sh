#!/usr/bin/env bash
# The GPU lane on a host without network, from a checkout of epdbench and the offline bundle that
# `epdbench engine-env --wheelhouse DIR` made (its parts gathered in one folder):
#   bash benchmarks/gpu_lane.sh WHEELHOUSE OUT [install|truth|lane|all] [ARGS...]
# (ARGS go to the truth or lane script, e.g. `--deadline-s 400` to truth: run again with the same OUT to go on)
# install: vLLM's environment from the bundle (its install.sh), then epdbench's light part into it (no Prefect or
#          MLflow: the specs, the load generator, the local target and the evidence verifiers) with the few wheels
#          it needs beside vLLM's (the bundle's `extra/` folder: orjson, vllm-router);
# truth:   benchmarks/vllm_truth.py — the spec vllm-truth's cells on one engine, with the product's load generator
#          and with `vllm bench serve` (OUT/truth/truth.csv);
# lane:    benchmarks/gpu_local_lane.py — the spec gpu-qwen25vl's configurations (aggregated, PD over NIXL, EPD) on
#          the local target with their transport and stage evidence (OUT/lane/lane.json).
# The engine environment's python is written to OUT/vllm-python; later steps read it from there.
set -euo pipefail
wh=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd); what=${3:-all}; shift $(( $# < 3 ? $# : 3 ))
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${EPDBENCH_GPU_VENV:-$HOME/.cache/epdbench/vllm-gpu}
export PYTHONUNBUFFERED=1

if [[ $what == install || $what == all ]]; then
  start=$(date +%s)
  bash "$wh/install.sh" --venv "$venv" | tee "$out/install.log"
  py=$(tail -n 1 "$out/install.log")
  [[ -x $py ]] || { echo "gpu_lane: install.sh did not end with the environment's python (last line: $py)"; exit 1; }
  pipin() { "$py" -m pip "$@" 2>/dev/null || python3 -m pip --python "$py" "$@"; }
  if compgen -G "$wh/extra/*.whl" >/dev/null; then
    pipin install -q --no-index --no-deps --no-compile "$wh"/extra/*.whl
  fi
  pipin install -q --no-index --no-deps --no-build-isolation --no-compile "$here"
  # from / : in the checkout, its own epdbench/ folder would shadow the installed package
  (cd / && "$py" -c "import epdbench.tasks.local.target, epdbench.tasks.load.loadgen, vllm; print('epdbench + vLLM', vllm.__version__)")
  echo "$py" > "$out/vllm-python"
  echo "gpu_lane: installed in $(( $(date +%s) - start )) s"
fi
py=$(cat "$out/vllm-python")
# vllm-router and the EPD proxy are started from the environment's bin folder
export PATH="$(dirname "$py"):$PATH"

if [[ $what == truth || $what == all ]]; then
  "$py" "$here/benchmarks/vllm_truth.py" --spec vllm-truth --vllm-python "$py" --out "$out/truth" "$@"
fi
if [[ $what == lane || $what == all ]]; then
  "$py" "$here/benchmarks/gpu_local_lane.py" --spec gpu-qwen25vl --vllm-python "$py" --out "$out/lane" "$@"
fi
