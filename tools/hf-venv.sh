#!/usr/bin/env bash
# tools/hf-venv.sh [DIR]: makes the git-ignored venv (default build/hf-venv) that the HF
# reference tests run in: torch, transformers, peft and safetensors from PyPI. Idempotent:
# a venv whose python already imports them is left as it is. Never run by `make test`.
# Then:
#   VARENT_HF_PYTHON=$PWD/build/hf-venv/bin/python make test T=hf      # hf_compare, interp_hf
#   VARENT_HF_PYTHON=$PWD/build/hf-venv/bin/python make test T=lora_peft
# lm-evaluation-harness (tests/py/test_lmeval_hf.py, docs/server.md) goes into the same venv:
#   build/hf-venv/bin/pip install 'lm-eval[api,hf]'
#   make test T=lmeval_hf     # needs weights/SmolLM2-135M-Instruct (weights/fetch-smollm2.sh)
# Env: PYTHON (python3) makes the venv; HF_VENV_PACKAGES replaces the pinned list (the
# versions docs/research.md reports), e.g. HF_VENV_PACKAGES="torch transformers peft
# safetensors numpy" for the newest.
# Size: about 5.6 GB; the install takes minutes, mostly the download (about a quarter of an
# hour on the shared 2-core development VM, 2026-11-28; lm-eval a few more). PyPI's Linux
# torch wheel is the CUDA build; installed with --no-deps it does not import even on a CPU
# (libtorch_cuda.so needs libcufile.so.0, libcusparseLt.so.0 and libnvshmem_host.so.3 from
# the nvidia-* wheels), so its dependencies come too. The lm-eval line above was checked
# with lm-eval 0.4.13 (docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/hf-venv}
pkgs=${HF_VENV_PACKAGES:-"torch==2.15.0 transformers==5.24.0 peft==0.21.2 safetensors==0.8.0 numpy"}
probe='import numpy, peft, safetensors, torch, transformers
print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
      f"safetensors {safetensors.__version__}, numpy {numpy.__version__}")'
if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "$probe" 2>/dev/null; then
    echo "hf-venv: $dir is ready"
else
    [ -x "$dir/bin/python" ] || "${PYTHON:-python3}" -m venv "$dir"
    echo "hf-venv: installing $pkgs into $dir" >&2
    # shellcheck disable=SC2086  # the list splits into packages
    "$dir/bin/python" -m pip install -q $pkgs
    "$dir/bin/python" -c "$probe"
fi
echo "VARENT_HF_PYTHON=$(cd "$dir" && pwd)/bin/python"
