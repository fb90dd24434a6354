#!/usr/bin/env bash
# Build llama-server from the llama.cpp sources vendored in the llama-cpp-python sdist
# that kvphase pins, so the server and the in-process backend run the same llama.cpp.
# By default only the server, its common library and its HTTP layer are compiled, linked
# against the libllama/libggml/libmtmd shared libraries llama-cpp-python installed (the same
# build the in-process backend loads), and without optimisation: every kernel runs in those
# optimised libraries, so -O0 costs the server's HTTP and JSON layer a few milliseconds a request
# and halves the compile (measured: 5.7 CPU-minutes at -O0, 12 at -O3; a whole build 23), which a
# unity build halves again (below). FULL=1 (or
# libraries it cannot use) builds llama.cpp whole into one static binary instead.
# The binary is cached under .cache/llama-server/<version>/ (ignored by git) of the main
# checkout, so git worktrees share one build: a second call returns at once. Prints the
# binary's path on stdout; progress goes to stderr.
#
#   scripts/build_llama_server.sh [VERSION]     (default: the pin in pyproject.toml)
#   JOBS=2 NICE=10 PYTHON=.venv/bin/python FULL=1  (environment overrides)
#
# No package in the registries ships a usable llama-server binary, hence the build
# (a whole build: 35 minutes wall, 23 CPU-minutes with -j2 on a busy 2-core machine; the
# server alone, at -O0, as a unity build: 1.8). The UI download and OpenSSL are switched off so the
# build needs no network beyond the sdist itself.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VERSION=${1:-$(sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)}
[ -n "$VERSION" ] || { echo "build_llama_server: no llama-cpp-python pin in pyproject.toml" >&2; exit 1; }
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
JOBS=${JOBS:-2}
LIB=$("$PYTHON" -c "import importlib.util, pathlib
print(pathlib.Path(importlib.util.find_spec('llama_cpp').origin).parent / 'lib')" 2>/dev/null || true)
NICE=${NICE:-10}
# A worktree's common git dir sits in the main checkout; a plain clone's is its own .git.
COMMON=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || echo "$ROOT/.git")
CACHE=$(dirname "$COMMON")/.cache/llama-server/$VERSION
BIN=$CACHE/bin/llama-server

# a cached binary that no longer starts (the libraries it links were removed) is built again
runs() { [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; }
# llama.cpp's RPC pieces beside it: rpc-server, and the RPC backend as a module that ggml loads
# from the binaries' folder (llama-cpp-python's libraries are built without it)
rpc_built() { [ -x "$CACHE/bin/rpc-server" ] && [ -f "$CACHE/bin/libggml-rpc.so" ] || [ -z "$LIB" ]; }
if runs && rpc_built; then echo "$BIN"; exit 0; fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9  # another checkout (a worktree) may be building the same version: wait for it
if runs && rpc_built; then echo "$BIN"; exit 0; fi
SDIST=$CACHE/llama_cpp_python-$VERSION.tar.gz
if [ ! -f "$SDIST" ]; then
    echo "build_llama_server: downloading the llama-cpp-python $VERSION sdist..." >&2
    "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps \
        "llama-cpp-python==$VERSION" -d "$CACHE/download" >&2
    mv "$CACHE/download/llama_cpp_python-$VERSION.tar.gz" "$SDIST"
    rm -rf "$CACHE/download"
fi
SRC=$CACHE/src
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
OPTIONS=(-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF
         -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
         -DLLAMA_BUILD_COMMIT="llama-cpp-python-$VERSION")

fresh_sources() {
    rm -rf "$SRC" "$CACHE/build" && mkdir -p "$SRC"
    tar xzf "$SDIST" -C "$SRC" --strip-components=3 "llama_cpp_python-$VERSION/vendor/llama.cpp"
}

# llama.cpp's CMake with its ggml, llama and mtmd targets taken from llama-cpp-python's libraries.
# $1 ON: as a unity build, 8 sources to a compilation, so the JSON templates they share are compiled
# once per batch (measured: 105 CPU-s and 56 s wall, against 235 and 127 one source at a time);
# common/json.cpp alone, as its specializations must come before any use of them.
on_installed_libraries() {
    [ -z "${FULL:-}" ] && [ -n "$LIB" ] && [ -f "$LIB/libllama.so" ] || return 1
    fresh_sources
    "$PYTHON" - "$SRC" >&2 <<'EOF' || return 1
import pathlib, sys
src = pathlib.Path(sys.argv[1])
with open(src / "common/CMakeLists.txt", "a") as cmake:
    cmake.write("set_source_files_properties(json.cpp PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)\n")
edits = [("CMakeLists.txt", "if (LLAMA_USE_SYSTEM_GGML)\n", "include(${KVPHASE_PREBUILT})\nif (LLAMA_USE_SYSTEM_GGML)\n"),
         ("CMakeLists.txt", "add_subdirectory(src)\n", ""),
         ("CMakeLists.txt", "install(TARGETS llama LIBRARY PUBLIC_HEADER)\n", ""),
         ("tools/CMakeLists.txt", "    add_subdirectory(mtmd)\n", "")]
for name, old, new in edits:
    text = (src / name).read_text()
    if text.count(old) != 1:
        sys.exit(f"build_llama_server: {name} of this llama.cpp lacks {old.strip()!r}; building it whole")
    (src / name).write_text(text.replace(old, new))
EOF
    echo "build_llama_server: building llama-server $VERSION against $LIB with $JOBS jobs (several minutes)..." >&2
    nice -n "$NICE" cmake -S "$SRC" -B "$CACHE/build" "${GEN[@]}" "${OPTIONS[@]}" \
        -DCMAKE_BUILD_TYPE=None -DCMAKE_C_FLAGS=-O0 -DCMAKE_CXX_FLAGS=-O0 \
        -DKVPHASE_PREBUILT="$ROOT/scripts/llama_server_prebuilt.cmake" -DKVPHASE_LLAMA_LIB="$LIB" \
        -DCMAKE_UNITY_BUILD="$1" -DCMAKE_UNITY_BUILD_BATCH_SIZE=8 >&2 &&
    nice -n "$NICE" cmake --build "$CACHE/build" --target llama-server -j "$JOBS" >&2
}

whole() {
    fresh_sources
    echo "build_llama_server: building llama.cpp and llama-server $VERSION whole with $JOBS jobs (15-40 minutes)..." >&2
    nice -n "$NICE" cmake -S "$SRC" -B "$CACHE/build" "${GEN[@]}" "${OPTIONS[@]}" -DCMAKE_BUILD_TYPE=Release >&2
    nice -n "$NICE" cmake --build "$CACHE/build" --target llama-server -j "$JOBS" >&2
}

# rpc-server and libggml-rpc.so against llama-cpp-python's libraries: two files of ggml-rpc and one
# of the tool, seconds to compile. A llama-server built whole has no RPC (FULL=1 builds no pieces).
rpc_pieces() {
    [ -n "$LIB" ] && [ -f "$LIB/libggml-base.so" ] || return 0
    [ -d "$SRC/ggml/src/ggml-rpc" ] || fresh_sources
    local cxx=${CXX:-c++} flags=(-O2 -std=c++17 -I"$SRC/ggml/include" -I"$SRC/ggml/src" -L"$LIB" -Wl,-rpath,"$LIB")
    echo "build_llama_server: building rpc-server and the RPC backend module..." >&2
    nice -n "$NICE" "$cxx" "${flags[@]}" -fPIC -shared -DGGML_BACKEND_DL -DGGML_BACKEND_BUILD -DGGML_BACKEND_SHARED \
        -DGGML_SHARED "$SRC/ggml/src/ggml-rpc/ggml-rpc.cpp" "$SRC/ggml/src/ggml-rpc/transport.cpp" -lggml-base \
        -o "$CACHE/bin/libggml-rpc.so.tmp" >&2 &&
    nice -n "$NICE" "$cxx" "${flags[@]}" "$SRC/tools/rpc/rpc-server.cpp" -lggml -lggml-base \
        -o "$CACHE/bin/rpc-server.tmp" >&2 &&
    mv "$CACHE/bin/libggml-rpc.so.tmp" "$CACHE/bin/libggml-rpc.so" && mv "$CACHE/bin/rpc-server.tmp" "$CACHE/bin/rpc-server"
}

START=$(date +%s)
mkdir -p "$CACHE/bin"
if ! runs; then
    on_installed_libraries ON || on_installed_libraries OFF || whole
    cp "$CACHE/build/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
fi
rpc_pieces
rm -rf "$CACHE/build" "$SRC"
echo "build_llama_server: built in $(( $(date +%s) - START ))s" >&2
echo "$BIN"
