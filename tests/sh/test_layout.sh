#!/usr/bin/env bash
# The one-way dependency rule of docs/architecture.md, checked by tools/check-layout.py:
# the real tree is clean, and planted violations in a scratch tree are each caught
# with the file and line.
set -u
cd "${ROOT:-$(dirname "$0")/../..}"
TMP=${TESTTMP:-tests/tmp}/layout
PYTHON=${PYTHON:-python3}

ok() {  # name, condition result ($?), detail
    if [ "$2" -eq 0 ]; then echo "PASS $1"; else echo "FAIL $1: $3"; fi
}

out=$("$PYTHON" tools/check-layout.py . 2>&1)
ok layout_tree_is_clean $? "$out"

# A minimal clean tree, then one planted problem at a time.
fresh() {
    rm -rf "$TMP"
    mkdir -p "$TMP/host/runtime" "$TMP/host/decode" "$TMP/host/formats" "$TMP/host/util" "$TMP/model/cuda" "$TMP/kernels"
    printf '// session.h: a session.\n#include "model/forward.h"\n#include "host/util/err.h"\n' >"$TMP/host/runtime/session.h"
    printf '// entropix.h: the decision.\n#include "host/runtime/session.h"\n' >"$TMP/host/decode/entropix.h"
    printf '// gguf.h: reader.\n#include "kernels/ops.h"\n' >"$TMP/host/formats/gguf.h"
    printf '// err.h: errors.\n' >"$TMP/host/util/err.h"
    printf '#include "host/formats/gguf.h"\n' >"$TMP/model/forward.h"
    printf '#include "host/util/err.h"\n' >"$TMP/kernels/ops.h"
    printf '#include "model/forward.h"\n#include "kernels/ops.h"\n' >"$TMP/model/cuda/core.h"
    printf '#include "model/cuda/core.h"\n' >"$TMP/model/cuda/tp.h"
    printf '#include "model/cuda/tp.h"\n#include "model/cuda/core.h"\n' >"$TMP/model/cuda/hooks.h"
    printf '#include "model/cuda/hooks.h"\n' >"$TMP/model/cuda/step.c"
}
expect_fail() {  # name, what the message must contain
    out=$("$PYTHON" tools/check-layout.py "$TMP" 2>&1)
    rc=$?
    [ $rc -eq 1 ] && [[ $out == *"$2"* ]]
    ok "$1" $? "rc $rc, wanted a message with '$2': $out"
}

fresh
"$PYTHON" tools/check-layout.py "$TMP" >/dev/null 2>&1
ok layout_scratch_tree_is_clean $? "the planted tree fails before any plant"

fresh
printf '#include "host/decode/entropix.h"\n' >>"$TMP/host/runtime/session.h"
expect_fail layout_catches_runtime_to_decode "host/runtime/session.h:4: host/runtime/ may not include host/decode/entropix.h"

fresh
printf '// convert.c: x\n#include "host/cli/args.h"\n' >"$TMP/host/formats/convert.c"
expect_fail layout_catches_formats_to_cli "host/formats/convert.c:2: host/formats/ may not include host/cli/args.h"

fresh
printf '#include "host/runtime/kv_cache.h"\n' >>"$TMP/model/forward.h"
expect_fail layout_catches_model_to_runtime "model/forward.h:2: model/ may not include host/runtime/kv_cache.h"

fresh
printf '#include "model/model.h"\n' >>"$TMP/kernels/ops.h"
expect_fail layout_catches_kernels_to_model "kernels/ops.h:2: kernels/ may not include model/model.h"

fresh
printf '#include "host/formats/gguf.h"\n' >>"$TMP/host/util/err.h"
expect_fail layout_catches_util_upward "host/util/err.h:2: host/util/ may not include host/formats/gguf.h"

fresh
printf 'int x;\n' >"$TMP/host/loose.c"
expect_fail layout_catches_file_in_host_root "host/loose.c: host/ holds only role folders"

fresh
mkdir -p "$TMP/host/misc" && printf 'int x;\n' >"$TMP/host/misc/a.c"
expect_fail layout_catches_unknown_folder "host/misc/a.c: folder host/misc/ is not in"

fresh
printf '// decode_branch.h: x\n' >"$TMP/host/decode/decode_branch.h"
expect_fail layout_catches_repeated_folder_name "host/decode/decode_branch.h: the name repeats its folder"

fresh
printf '#pragma once\n' >"$TMP/host/decode/branch.h"
expect_fail layout_catches_header_without_comment "host/decode/branch.h:1: a header opens with '// branch.h: what this is'"
# The device forward's tiers: the core knows nothing of the parts built on it, the
# CPU model and host/ nothing of model/cuda/ (host/ uses model/forward_cuda.h).
fresh
printf '#include "model/cuda/tp.h"\n' >>"$TMP/model/cuda/core.h"
expect_fail layout_catches_cuda_core_upward "model/cuda/core.h:3: core.h (tier 0) may not include model/cuda/tp.h (tier 1)"

fresh
printf '#include "model/cuda/hooks.h"\n' >>"$TMP/model/cuda/tp.h"
expect_fail layout_catches_cuda_tp_to_hooks "model/cuda/tp.h:2: tp.h (tier 1) may not include model/cuda/hooks.h (tier 2)"

fresh
printf '#include "model/cuda/lora.h"\n' >>"$TMP/model/cuda/tp.h"
expect_fail layout_catches_cuda_same_tier "model/cuda/tp.h:2: tp.h (tier 1) may not include model/cuda/lora.h (tier 1)"

fresh
printf 'int x;\n' >"$TMP/model/cuda/misc.c"
expect_fail layout_catches_cuda_file_without_tier "model/cuda/misc.c: model/cuda/ file not in"

fresh
printf '#include "model/cuda/core.h"\n' >>"$TMP/model/forward.h"
expect_fail layout_catches_model_to_cuda "model/forward.h:2: model/ may not include model/cuda/core.h"

fresh
printf '#include "model/cuda/core.h"\n' >>"$TMP/host/runtime/session.h"
expect_fail layout_catches_host_to_cuda_internals "host/runtime/session.h:4: host/runtime/ may not include model/cuda/core.h"
rm -rf "$TMP"
