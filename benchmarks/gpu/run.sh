#!/usr/bin/env bash
# The whole GPU measurement in one command (benchmarks/gpu/README.md): build, then benchmarks/gpu/measure.py.
#
#   bash benchmarks/gpu/run.sh                 # on the GPU machine: CUDA sm_90, 16 jobs, report into $OUT
#   bash benchmarks/gpu/run.sh --cpu-tiny      # here: CUDA off, tiny shapes, the same steps end to end
#   options: --jobs N, --budget S (seconds for the whole command, default 570), --build-only
#
# 1. Unpack .gpu/llama.cpp.tar.xz (made by pack.sh) into build/gpu/.
# 2. The GGUFs (measure.py --gen-only) in the background while the compiler runs. Build llama-server, libllama
#    and libggml ONCE from that b11434 tree: BUILD_SHARED_LIBS, RPATH $ORIGIN, the project's pinned portable CPU
#    flags, and with CUDA for sm_90 only (-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90); skipped when
#    build/gpu/<build>/bin already holds them (a second command on the same warm machine). Wall and CPU seconds
#    go to $OUT/build.json.
# 3. A Python site in build/gpu/site: llama-cpp-python's package from .gpu/llama_cpp_python.tar.gz with the libs
#    of step 2 in llama_cpp/lib, and .gpu/wheels when this Python lacks pydantic; gguf-py from the llama.cpp tree.
# 4. benchmarks/gpu/measure.py with what is left of the budget: GGUF generation, the timings, the report
#    ($OUT/gpu-report.md and .json, rewritten after every step).
set -uo pipefail
cd "$(dirname "$0")/../.."
MODE=gpu JOBS=$(nproc) BUDGET=570 BUILD_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-tiny) MODE=cpu-tiny ;;
    --jobs) JOBS=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --build-only) BUILD_ONLY=1 ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
T0=$(date +%s)
W=build/gpu
OUT=${OUT:-$W/out}
mkdir -p "$W" "$OUT"
log() { echo "[run.sh $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
[ -f .gpu/llama.cpp.tar.xz ] || { log "no .gpu/llama.cpp.tar.xz: run benchmarks/gpu/pack.sh here first and carry .gpu"; exit 1; }

PY=${PYTHON:-python3}
[ -z "${PYTHON:-}" ] && [ "$MODE" = cpu-tiny ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONUNBUFFERED=1

if [ "$MODE" = gpu ]; then
  BLD=$W/build-cuda
  FLAGS=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF)
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/run.log"
  # ggml-cuda links cuBLAS. A CUDA toolkit assembled from pip wheels (as on this project's CPU machine) has none
  # in its own folder; then take the nvidia-cublas wheel of this Python (PyTorch's) for headers and libraries.
  cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  if ! compgen -G "$cuda_home/lib64/libcublas.so*" >/dev/null && \
     ! compgen -G "$cuda_home/targets/x86_64-linux/lib/libcublas.so*" >/dev/null; then
    sites=$("$PY" -c "import site, sys; print(' '.join(site.getsitepackages() + [p for p in sys.path if p.endswith('-packages')]))")
    # shellcheck disable=SC2086
    blas=$(find $sites -name 'libcublas.so*' 2>/dev/null | grep -v Lt | head -1)
    # shellcheck disable=SC2086
    blaslt=$(find $sites -name 'libcublasLt.so*' 2>/dev/null | head -1)
    # shellcheck disable=SC2086
    hdr=$(find $sites -name cublas_v2.h 2>/dev/null | head -1)
    if [ -n "$blas" ] && [ -n "$blaslt" ] && [ -n "$hdr" ]; then
      log "build: cuBLAS from pip: $blas, headers $(dirname "$hdr")"
      FLAGS+=("-DCUDA_cublas_LIBRARY=$blas" "-DCUDA_cublasLt_LIBRARY=$blaslt" "-DCMAKE_CUDA_FLAGS=-I$(dirname "$hdr")")
      export LD_LIBRARY_PATH="$(dirname "$blas"):$(dirname "$blaslt")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    else
      log "build: no cuBLAS in $cuda_home nor in $PY's packages: the CUDA build will fail at configure"
    fi
  fi
else
  BLD=$W/build-cpu
  FLAGS=(-DGGML_CUDA=OFF)
fi

# 1. unpack (kept between commands on the same warm machine)
if [ ! -f "$W/llama.cpp/CMakeLists.txt" ]; then
  rm -rf "$W/llama.cpp" && tar -xJf .gpu/llama.cpp.tar.xz -C "$W" || exit 1
fi
# 2a. the GGUFs, in the background while the compiler runs (skipped for files already there)
GEN_PID=
if [ "$BUILD_ONLY" = 0 ]; then
  PYTHONPATH="$PWD/$W/llama.cpp/gguf-py:$PWD${PYTHONPATH:+:$PYTHONPATH}" nice -n 5 "$PY" benchmarks/gpu/measure.py \
    --mode "$MODE" --bin "$BLD/bin" --work "$W" --out "$OUT" --gen-only > "$OUT/gen.log" 2>&1 &
  GEN_PID=$!
fi
# 2b. build
if [ -x "$BLD/bin/llama-server" ] && compgen -G "$BLD/bin/libllama.so*" >/dev/null; then
  log "build: $BLD already holds llama-server and libllama (kept from an earlier command); not rebuilding"
else
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  tb=$(date +%s)
  log "build: configure ($MODE, ${FLAGS[*]})"
  cmake -S "$W/llama.cpp" -B "$BLD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    "${FLAGS[@]}" > "$OUT/build-configure.log" 2>&1 || { tail -30 "$OUT/build-configure.log"; log "build: configure failed"; exit 1; }
  tc=$(date +%s)
  log "build: compile llama-server llama ggml with -j$JOBS"
  TIMEFORMAT='%R %U %S'
  { time cmake --build "$BLD" --config Release -j "$JOBS" --target llama-server llama ggml > "$OUT/build.log" 2>&1 ; } 2> "$W/build.time" \
    || { tail -40 "$OUT/build.log"; log "build: failed"; exit 1; }
  te=$(date +%s)
  read -r _ cu cs < "$W/build.time"
  printf '{"mode": "%s", "jobs": %s, "configure_s": %s, "compile_s": %s, "total_s": %s, "compile_cpu_s": %.0f, "flags": "%s"}\n' \
    "$MODE" "$JOBS" $((tc - tb)) $((te - tc)) $((te - tb)) "$(awk -v u="$cu" -v s="$cs" 'BEGIN {print u + s}')" "${FLAGS[*]}" > "$OUT/build.json"
  log "build: done in $((te - tb)) s ($(cat "$OUT/build.json"))"
  tail -3 "$OUT/build.log" >> "$OUT/run.log"; rm -f "$OUT/build.log"  # $OUT brings back at most 8 files
fi
[ "$BUILD_ONLY" = 1 ] && exit 0

# 3. Python site
SITE=$W/site
rm -rf "$SITE" && mkdir -p "$SITE"
tar -xzf .gpu/llama_cpp_python.tar.gz -C "$SITE" || exit 1
mkdir -p "$SITE/llama_cpp/lib" && cp -a "$BLD"/bin/lib*.so* "$SITE/llama_cpp/lib/"
if ! "$PY" -c "import pydantic, diskcache" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .gpu/wheels/*.whl || exit 1
fi
export PYTHONPATH="$PWD/$SITE:$PWD/$W/llama.cpp/gguf-py:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "$GEN_PID" ]; then
  wait "$GEN_PID" || log "gen: the background GGUF writer failed (measure.py retries): $(tail -3 "$OUT/gen.log")"
  log "gen: $(grep -c wrote "$OUT/gen.log") file(s) written"
fi

# 4. measure, with what is left of the budget
left=$(( BUDGET - ($(date +%s) - T0) ))
log "measure: $left s left of $BUDGET"
PYTHONPATH="$PWD/$W/llama.cpp/gguf-py:$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" benchmarks/gpu/measure.py \
  --mode "$MODE" --bin "$BLD/bin" --work "$W" --out "$OUT" --budget "$left" \
  2>&1 | tee -a "$OUT/run.log"
rc=${PIPESTATUS[0]}
log "done (measure.py exit $rc)"
exit "$rc"
