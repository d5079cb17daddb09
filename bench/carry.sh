#!/usr/bin/env bash
# Assemble .carry/ (git-ignored): what bench/h100.sh needs on a GPU machine that has no internet.
#
#   bash bench/carry.sh            # writes .carry/base and .carry/node, prints their sizes
#
# .carry/base  (~10 MiB)  llama.cpp.tar.xz   llama.cpp source from the llama-cpp-python sdist
#                                            (.cache/sdist, see build.py), trimmed to what the
#                                            CUDA build of llama-bench, llama-quantize,
#                                            llama-mtmd-cli and llama-speculative-simple needs
#                         vocab.gguf.xz      llama.cpp's ggml-vocab-gemma-4.gguf (tokenizer keys
#                                            for the bench models; a26b's gemma4.* header)
#                         whl/*.whl          wgpu cffi pycparser rendercanvas gguf, cp312 manylinux
#                         gl/*.deb           Vulkan loader (libvulkan1 ...), .gl of the device README
# .carry/nodebin, .carry/nodebin2 (~11 MiB each) node.xz.0, node.xz.1   this machine's node binary, stripped,
#                                            xz'd and cut in two (a carry each: with the working tree's
#                                            ~46 MiB of fixtures, a whole one exceeds a call's 64 MiB;
#                                            the working tree, base and node exceed one call's 64 MiB)
# .carry/node  (~10 MiB)
#                         pyodide.tar.xz     node_modules/pyodide, only what loadPyodide reads
#                         webgpu.tar.xz      node_modules/webgpu: index.js package.json dist/linux-x64
#
# Needs: xz, tar, strip, python3 with pip, apt-get (Debian/Ubuntu, for the .deb loaders),
# npm only when node_modules/webgpu is missing. Rerun after changing nothing: it rebuilds all.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CARRY=$ROOT/.carry
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
XZ="xz -T0 -9"
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
# the device's Python is 3.12 (KINDS.md); versions as in .venv
WHEELS=${WHEELS:-"wgpu==0.32.0 cffi==2.1.1 pycparser==3.12 rendercanvas==2.7.2 gguf==0.19.0"}

rm -rf "$CARRY/base" "$CARRY/node" "$CARRY/nodebin" "$CARRY/nodebin2"
mkdir -p "$CARRY/base/whl" "$CARRY/base/gl" "$CARRY/node" "$CARRY/nodebin" "$CARRY/nodebin2"

# ---- llama.cpp source, trimmed ------------------------------------------------------------
SDIST=$(ls .cache/sdist/llama_cpp_python-*.tar.gz 2>/dev/null | sort | tail -1 || true)
if [ -z "$SDIST" ]; then
    "$PY" build.py setup >/dev/null          # downloads the sdist into .cache/sdist
    SDIST=$(ls .cache/sdist/llama_cpp_python-*.tar.gz | sort | tail -1)
fi
echo "llama.cpp from $SDIST"
tar -xzf "$SDIST" -C "$TMP" --wildcards '*/vendor/llama.cpp/*'
SRC=$(echo "$TMP"/llama_cpp_python-*/vendor/llama.cpp)
DST=$TMP/llama.cpp
mkdir -p "$DST/ggml/src" "$DST/tools"
cp -a "$SRC"/CMakeLists.txt "$SRC"/LICENSE "$SRC"/cmake "$SRC"/include "$SRC"/src "$SRC"/common "$SRC"/vendor "$DST"/
cp -a "$SRC"/ggml/CMakeLists.txt "$SRC"/ggml/cmake "$SRC"/ggml/include "$DST/ggml/"
find "$SRC/ggml/src" -maxdepth 1 -type f -exec cp -a {} "$DST/ggml/src/" \;
cp -a "$SRC/ggml/src/ggml-cpu" "$SRC/ggml/src/ggml-cuda" "$DST/ggml/src/"
cp -a "$SRC/tools/llama-bench" "$SRC/tools/quantize" "$DST/tools/"
# tools/mtmd (llama-mtmd-cli: images, issue 28) without its sample media, tests and legacy models
mkdir -p "$DST/tools/mtmd"
(cd "$SRC/tools/mtmd" && cp -a ./*.cpp ./*.h CMakeLists.txt models debug "$DST/tools/mtmd/")
# tools/CMakeLists.txt adds every tool (their sources must exist at configure time): only these three
cat > "$DST/tools/CMakeLists.txt" <<'EOF'
# trimmed by bench/carry.sh: only llama-bench, quantize (llama-quantize) and mtmd (llama-mtmd-cli)
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(quantize)
add_subdirectory(mtmd)
EOF
# examples/speculative-simple (llama-speculative-simple: an assistant drafter, issue 29 goal 4) alone
mkdir -p "$DST/examples"
cp -a "$SRC/examples/speculative-simple" "$DST/examples/"
cat > "$DST/examples/CMakeLists.txt" <<'EOF'
# trimmed by bench/carry.sh: only speculative-simple (llama-speculative-simple)
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(speculative-simple)
EOF
mkdir -p "$DST/pocs"           # the examples bring pocs/ along: nothing of it is built
echo "# emptied by bench/carry.sh" > "$DST/pocs/CMakeLists.txt"
VERSION=$(basename "$SDIST" .tar.gz)
echo "$VERSION" > "$DST/SOURCE"
tar -C "$TMP" -cf - llama.cpp | $XZ > "$CARRY/base/llama.cpp.tar.xz"

# ---- vocabulary ----------------------------------------------------------------------------
VOCAB=.cache/llama.cpp/models/ggml-vocab-gemma-4.gguf
[ -f "$VOCAB" ] || "$PY" build.py setup >/dev/null
$XZ -c "$VOCAB" > "$CARRY/base/vocab.gguf.xz"

# ---- wheels (device: CPython 3.12, x86-64; numpy, pyyaml, tqdm, requests are there) --------
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$CARRY/base/whl" $WHEELS 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
n_whl=$(ls "$CARRY"/base/whl/*.whl 2>/dev/null | wc -l)
[ "$n_whl" -eq "$(echo $WHEELS | wc -w)" ] || { echo "pip download got $n_whl of: $WHEELS" >&2; exit 1; }

# ---- Vulkan loader (device README: `.gl`) ---------------------------------------------------
if [ -d "$ROOT/.gl" ] && ls "$ROOT"/.gl/libvulkan1_*.deb >/dev/null 2>&1; then
    cp "$ROOT"/.gl/*.deb "$CARRY/base/gl/"
else
    mkdir -p "$TMP/amd64/partial"
    o="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=$TMP/amd64"
    # shellcheck disable=SC2086
    apt-get $o update -q >/dev/null
    # shellcheck disable=SC2086
    (cd "$CARRY/base/gl" && apt-get $o download -q libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 >/dev/null)
fi

# ---- node, Pyodide, Dawn --------------------------------------------------------------------
NODE=$(command -v node)
cp "$NODE" "$TMP/node" && strip "$TMP/node" 2>/dev/null || cp "$NODE" "$TMP/node"
$XZ -c "$TMP/node" > "$TMP/node.xz"
half=$(( ($(stat -c %s "$TMP/node.xz") + 1) / 2 ))
head -c "$half" "$TMP/node.xz" > "$CARRY/nodebin/node.xz.0"
tail -c +$(( half + 1 )) "$TMP/node.xz" > "$CARRY/nodebin2/node.xz.1"
P=node_modules/pyodide
[ -f "$P/pyodide.mjs" ] || npm install --no-audit --no-fund
# what loadPyodide() reads in Node: the loader, the Emscripten module, the wasm, the stdlib, the lockfile
tar -C "$P" -cf - pyodide.mjs pyodide.js pyodide.asm.mjs pyodide.asm.wasm python_stdlib.zip pyodide-lock.json \
    package.json | $XZ > "$CARRY/node/pyodide.tar.xz"
W=node_modules/webgpu
if [ ! -f "$W/dist/linux-x64/dawn.node" ]; then
    V=$(node -p "require('./package.json').devDependencies.webgpu")
    (cd "$TMP" && npm install --no-audit --no-fund --no-save --prefix "$TMP/npm" "webgpu@$V" >/dev/null)
    W=$TMP/npm/node_modules/webgpu
fi
tar -C "$W" -cf - index.js package.json dist/linux-x64 | $XZ > "$CARRY/node/webgpu.tar.xz"

# ---- sizes -----------------------------------------------------------------------------------
(cd "$CARRY" && du -b base/*.xz base/whl/* base/gl/* node/* nodebin/* nodebin2/*)
tree_b=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
base_b=$(du -sb "$CARRY/base" | cut -f1)
node_b=$(du -sb "$CARRY/node" | cut -f1)
bin_b=$(du -sb "$CARRY/nodebin" | cut -f1)
awk -v t="$tree_b" -v b="$base_b" -v n="$node_b" -v x="$bin_b" 'BEGIN {
    m = 1048576
    printf "working tree %.1f MiB, .carry/base %.1f, .carry/node %.1f, .carry/nodebin and nodebin2 %.1f MiB each: the tree with each of them %.1f, %.1f, %.1f MiB (limit 64 a call: carry them in separate calls where two exceed it)\n",
           t / m, b / m, n / m, x / m, (t + b) / m, (t + n) / m, (t + x) / m }'
