#!/usr/bin/env bash
# Create the virtual environments that `python -m bench run llm_decode` runs its LLM peers in
# (bench/variants/llm_peers).
#
#   bash bench/peers_setup.sh [llama_cpp] [optimum_intel]     (default: both)
#
# Each peer lives in its own venv under ${EMBEDL_BENCH_PEERS:-~/.cache/embedl_dynamo_bench/peers}
# (outside the repository, shared by every checkout), since their pins clash with ours:
# optimum-intel pins an older transformers and huggingface_hub than constraints.txt does.
# Every install runs under the repository's constraints.txt, minus the pins a peer must move.
#
# llama-cpp-python is built from source (its sdist vendors llama.cpp) for this CPU; the build
# runs at nice 19 on one core (CMAKE_BUILD_PARALLEL_LEVEL, default 1) and takes 15-30 min.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
peers="${EMBEDL_BENCH_PEERS:-$HOME/.cache/embedl_dynamo_bench/peers}"
python="${PYTHON:-python3}"
constraints="$here/constraints.txt"
mkdir -p "$peers"

# Refuse an install whose plan (pip's --dry-run, without -q, which would hide the plan) pulls
# CUDA packages or a torch other than 2.13.
plan_is_cpu_only() {
    local plan argument command=()
    for argument in "$@"; do [ "$argument" = -q ] || command+=("$argument"); done
    plan="$("${command[@]}" --dry-run 2>/dev/null | grep '^Would install' || true)"
    if grep -q -E 'nvidia-|cuda|torch-2\.(1[4-9]|[2-9][0-9])' <<<"$plan"; then
        echo "refusing to install: $plan" >&2
        return 1
    fi
}

checked_install() {
    plan_is_cpu_only "$@" || exit 1
    nice -n 19 "$@"
}

setup_llama_cpp() {
    local venv="$peers/llama_cpp"
    "$python" -m venv "$venv"
    checked_install "$venv/bin/pip" install -q -c "$constraints" numpy safetensors gguf
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" \
        CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-1}" \
        nice -n 19 "$venv/bin/pip" install -c "$constraints" \
        --no-binary llama-cpp-python llama-cpp-python==0.3.36
    "$venv/bin/python" -c "import llama_cpp, gguf; print('llama_cpp', llama_cpp.__version__)"
}

setup_optimum_intel() {
    local venv="$peers/optimum_intel"
    # optimum-intel 2.2 pins an older transformers / tokenizers / huggingface_hub: keep every
    # other pin of ours (torch above all, so pip takes the local CPU wheel).
    local shared="$peers/optimum_intel.constraints.txt"
    grep -v -E '^(transformers|tokenizers|huggingface_hub)==' "$constraints" > "$shared"
    echo "torchvision==0.28.0" >> "$shared"
    "$python" -m venv "$venv"
    checked_install "$venv/bin/pip" install -q -c "$shared" torch==2.13.0
    checked_install "$venv/bin/pip" install -q -c "$shared" "optimum-intel[openvino,nncf]==2.2.0"
    "$venv/bin/python" -c "import optimum.intel, openvino; print('openvino', openvino.__version__)"
}

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(llama_cpp optimum_intel)
for target in "${targets[@]}"; do
    case "$target" in
        llama_cpp) setup_llama_cpp ;;
        optimum_intel) setup_optimum_intel ;;
        *) echo "unknown peer '$target' (known: llama_cpp optimum_intel)" >&2; exit 2 ;;
    esac
done
