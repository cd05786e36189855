#!/usr/bin/env bash
# One set-up command for a fresh clone (the README's and CI's): a virtual environment in .venv
# with the package, its dev and docs extras under constraints.txt (which keeps pip on the CPU
# build of torch), and the TensorRT Python bindings the TensorRT proofs load on a CPU. Those
# need --no-deps --target, which no extra can say, so they are a second pip call here.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
pip install -q -c constraints.txt -e ".[dev,docs]"
pip install -q --no-deps --target .venv/tensorrt-proof -r tests/tensorrt-proof-requirements.txt
