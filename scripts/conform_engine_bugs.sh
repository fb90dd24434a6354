#!/usr/bin/env bash
# Proof that `kvphase conform` catches real engine bugs: llama.cpp's libllama built from the sources
# vendored in the llama-cpp-python sdist kvphase pins, once as it is and once per patch in
# scripts/conform_patches/ (each plants one defect: the deepseek4 compressor's block boundary one token
# early, glm5-next's k-pool pooling a plain mean; and, for the engine paths of issue 62, deepseek4's
# compressor state dropped by a sequence copy, a block completed in a one-token decode pooled one token
# early, a block begun in an earlier micro-batch re-pooled one row late; for issue 70, generation that starts at
# residue 3 mod 4 spoiled in every architecture), and `kvphase conform` run against each build through
# llama.cpp in process (llama-cpp-python loads libllama from LLAMA_CPP_LIB_PATH) and, when a llama-server
# binary is built (scripts/build_llama_server.sh), through llama-server (its libllama from LD_LIBRARY_PATH).
# The unpatched build must PASS, each patched one FAIL naming the moved residue or the path it breaks.
#
# Only libllama is compiled (its ggml kernels are llama-cpp-python's installed libraries): every
# source once, then each patch recompiles the one file it touches and relinks. Objects are kept in
# $BUILD (default .cache/conform-llama, ignored by git), so a second run only runs the checks.
#
#   scripts/conform_engine_bugs.sh [OUT]   (run folders under OUT, default reports/conform/engine-bugs)
#   JOBS=2 NICE=10 PYTHON=.venv/bin/python BUILD=DIR BACKENDS="llama.cpp server"  (environment overrides)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-reports/conform/engine-bugs}
[ "$OUT" = --objects-only ] && OUT=reports/conform/engine-bugs
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
JOBS=${JOBS:-2}
NICE=${NICE:-10}
BUILD=${BUILD:-$ROOT/.cache/conform-llama}
BACKENDS=${BACKENDS:-llama.cpp server}
VERSION=$(sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)
LIB=$("$PYTHON" -c "import importlib.util, pathlib
print(pathlib.Path(importlib.util.find_spec('llama_cpp').origin).parent / 'lib')" 2>/dev/null || true)
SRC=$BUILD/src
mkdir -p "$BUILD"

sources() {  # llama.cpp as vendored in the sdist (pip's cache, else downloaded)
    local sdist=$BUILD/llama_cpp_python-$VERSION.tar.gz
    if [ ! -f "$sdist" ] && [ ! -f "$SRC/src/llama.cpp" ]; then
        "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$BUILD/download" >&2
        mv "$BUILD/download/llama_cpp_python-$VERSION.tar.gz" "$sdist"
    fi
    if [ ! -f "$SRC/src/llama.cpp" ]; then
        mkdir -p "$SRC"
        tar xzf "$sdist" -C "$SRC" --strip-components=3 "llama_cpp_python-$VERSION/vendor/llama.cpp"
    fi
    sed -e "s/@LLAMA_VERSION@/$VERSION/; s/@LLAMA_BUILD_COMMIT@/llama-cpp-python-$VERSION/" \
        "$SRC/src/llama-version.h.in" > "$SRC/src/llama-version.h"
}

FLAGS=(-O1 -g0 -fPIC -std=c++17 -DLLAMA_BUILD -DLLAMA_SHARED -DGGML_SHARED -I"$SRC/src" -I"$SRC/src/models"
       -I"$SRC/include" -I"$SRC/ggml/include")

object_of() { echo "$BUILD/obj/$(basename "$(dirname "$1")")-$(basename "$1" .cpp).o"; }

compile() {  # compile SOURCE OBJECT: one translation unit
    nice -n "$NICE" c++ "${FLAGS[@]}" -c "$1" -o "$2.tmp" && mv "$2.tmp" "$2"
}

base_objects() {  # every libllama source once, JOBS at a time; an object already made is kept
    mkdir -p "$BUILD/obj"
    for source in "$SRC"/src/*.cpp "$SRC"/src/models/*.cpp; do
        [ -f "$(object_of "$source")" ] && continue
        compile "$source" "$(object_of "$source")" &
        while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    done
    wait
}

link() {  # link VARIANT [OBJECT REPLACED]...: libllama.so in $BUILD/VARIANT
    local variant=$1; shift
    local objects=("$BUILD"/obj/*.o)
    while [ $# -gt 0 ]; do
        objects=("${objects[@]/$2/$1}"); shift 2
    done
    mkdir -p "$BUILD/$variant"
    nice -n "$NICE" c++ -shared -Wl,-soname,libllama.so.0 -o "$BUILD/$variant/libllama.so.tmp" "${objects[@]}" \
        -L"$LIB" -Wl,-rpath,"$LIB" -lggml -lggml-base -lpthread
    mv "$BUILD/$variant/libllama.so.tmp" "$BUILD/$variant/libllama.so"
    # llama-cpp-python loads every library from one folder: the others are the installed ones, and
    # every name of libllama (libmtmd asks for its soname) is this build's
    for other in "$LIB"/*.so*; do
        case $(basename "$other") in
            libllama.so) ;;
            libllama.so*) ln -sf libllama.so "$BUILD/$variant/$(basename "$other")" 2>/dev/null || true ;;
            *) ln -sf "$other" "$BUILD/$variant/" ;;
        esac
    done
}

patched() {  # patched PATCH: the files it touches, patched and compiled, linked in place of theirs
    local patch=$1 variant dir replacements=()
    variant=$(basename "$1" .patch)
    dir=$BUILD/$variant-src
    rm -rf "$dir" && mkdir -p "$dir"
    local files
    files=$(sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "$patch")
    for file in $files; do
        mkdir -p "$dir/$(dirname "$file")" && cp "$SRC/$file" "$dir/$file"
    done
    patch --quiet -p1 -d "$dir" < "$patch"
    for file in $files; do
        compile "$dir/$file" "$dir/$(basename "$file" .cpp).o"
        replacements+=("$dir/$(basename "$file" .cpp).o" "$(object_of "$SRC/$file")")
    done
    link "$variant" "${replacements[@]}"
}

START=$(date +%s)
sources
echo "conform_engine_bugs: compiling libllama ($JOBS jobs)..." >&2
base_objects
[ "${1:-}" = --objects-only ] && exit 0  # (compiling can start while llama-cpp-python installs)
[ -f "$LIB/libggml.so" ] || { echo "conform_engine_bugs: no libggml.so in '$LIB' (llama-cpp-python not installed?)" >&2; exit 1; }
link unpatched
for patch in scripts/conform_patches/*.patch; do
    patched "$patch"
done
echo "conform_engine_bugs: built in $(( $(date +%s) - START ))s" >&2

# every build through llama.cpp in process (one thread: the check's own timing), and through
# llama-server when one is built: a server per reference model, its libllama the build's
COMMON=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || echo "$ROOT/.git")
SERVER=${KVPHASE_LLAMA_SERVER:-$(dirname "$COMMON")/.cache/llama-server/$VERSION/bin/llama-server}
VARIANTS=(unpatched)
for patch in scripts/conform_patches/*.patch; do VARIANTS+=("$(basename "$patch" .patch)"); done
status=0
for variant in "${VARIANTS[@]}"; do
    for backend in $BACKENDS; do
        folder=$OUT/$variant-$backend
        echo "== $variant through $backend -> $folder" >&2
        if [ "$backend" = llama.cpp ]; then
            LLAMA_CPP_LIB_PATH=$BUILD/$variant "$PYTHON" -m kvphase.cli conform --threads 1 --out "$folder" || status=$?
        elif [ -x "$SERVER" ]; then
            LD_LIBRARY_PATH=$BUILD/$variant KVPHASE_LLAMA_SERVER=$SERVER "$PYTHON" bench/bench_conform.py \
                --backend server --out "$folder" || status=$?
        else
            echo "conform_engine_bugs: no llama-server built (scripts/build_llama_server.sh); skipped" >&2
        fi
    done
done
echo "conform_engine_bugs: finished in $(( $(date +%s) - START ))s (the last conform's exit status: $status)" >&2
