#!/usr/bin/env bash
# The GPU lane on a host without network, from a checkout of epdbench and the offline bundle that
# `epdbench engine-env --wheelhouse DIR` made (its parts gathered in one folder):
#   bash benchmarks/gpu/gpu_lane.sh WHEELHOUSE OUT [install|compare|truth|lane|all] [ARGS...]
# (ARGS go to the step, e.g. `--deadline-s 400` to truth: run again with the same OUT to go on)
# install: the bundle's install.sh: vLLM's environment (with NIXL and Mooncake's transfer engine) and epdbench's own
#          (Prefect, MLflow, the report), side by side;
# compare: the product itself: `epdbench compare --target local --spec gpu-qwen25vl` with Prefect's ephemeral server
#          and MLflow in OUT/compare-mlflow.db (OUT/compare: report.md, report.html, evidence/);
# truth:   benchmarks/simulator/vllm_truth.py — the spec vllm-truth's cells on one engine, with the product's load
#          generator and with `vllm bench serve` (OUT/truth/truth.csv);
# lane:    benchmarks/gpu/gpu_local_lane.py — the spec gpu-qwen25vl's configurations on the local target without
#          Prefect or MLflow, with their transport and stage evidence (OUT/lane/lane.json).
# vLLM's python is written to OUT/vllm-python and epdbench's `epdbench` to OUT/epdbench; later steps read them there.
set -euo pipefail
wh=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd); what=${3:-all}; shift $(( $# < 3 ? $# : 3 ))
here=$(cd "$(dirname "$0")/../.." && pwd)
venv=${EPDBENCH_VLLM_VENV:-$HOME/.cache/epdbench/vllm-gpu}
epd_venv=${EPDBENCH_VENV:-$HOME/.cache/epdbench/epdbench-gpu}
export PYTHONUNBUFFERED=1

if [[ $what == install || $what == all ]]; then
  start=$(date +%s)
  bash "$wh/install.sh" --venv "$venv" --epdbench-venv "$epd_venv" | tee "$out/install.log"
  py=$(tail -n 2 "$out/install.log" | head -n 1); epd=$(tail -n 1 "$out/install.log")
  [[ -x $py && -x $epd ]] || { echo "gpu_lane: install.sh did not end with vLLM's python and epdbench's epdbench" \
                                    "(last lines: $py, $epd)"; exit 1; }
  echo "$py" > "$out/vllm-python"
  echo "$epd" > "$out/epdbench"
  echo "gpu_lane: installed in $(( $(date +%s) - start )) s"
fi
py=$(cat "$out/vllm-python"); epd=$(cat "$out/epdbench"); epy=$(dirname "$epd")/python

# from OUT: in the checkout, its own epdbench/ folder would shadow the installed package
if [[ $what == compare || $what == all ]]; then
  (cd "$out" && "$epd" compare --target local --spec gpu-qwen25vl --vllm-python "$py" --out "$out/compare" \
     --tracking-uri "sqlite:///$out/compare-mlflow.db" "$@")
fi
if [[ $what == truth || $what == all ]]; then
  (cd "$out" && "$epy" "$here/benchmarks/vllm_truth.py" --spec vllm-truth --vllm-python "$py" --out "$out/truth" "$@")
fi
if [[ $what == lane || $what == all ]]; then
  (cd "$out" && "$epy" "$here/benchmarks/gpu_local_lane.py" --spec gpu-qwen25vl --vllm-python "$py" \
     --out "$out/lane" "$@")
fi
