#!/usr/bin/env bash
# Side by side on a GPU machine without internet (the device machine): our engine (native wgpu,
# and the browser code path: Pyodide + Dawn in Node) against llama.cpp CUDA's llama-bench, on the
# same random-weight GGUF files.
#
#   bash bench/h100.sh STEP [STEP ...]        (run in the repository root; carried: .carry/base, .carry/node,
#                                             .carry/nodebin and .carry/nodebin2 (node itself, in two halves),
#                                             in as many calls as the 64 MiB a call needs: see carry.sh)
#
# Steps (each skips what is already done; REDO=1 redoes result steps):
#   setup    unpack .carry/base (wheels -> $W/site, Vulkan loader if the machine lacks one, llama.cpp
#            source, vocabulary) and .carry/node (node, Pyodide, Dawn), print the versions
#   build    start the CUDA build of BUILD_TARGETS (llama-bench, llama-quantize, llama-mtmd-cli) in the background (setsid:
#            it outlives this call, ~7 min on 16 cores), log in $W/build.log
#   models   write the bench models (MODELS) into /tmp with tools/make_bench_model.py, in parallel; for a
#            spec SHAPE:lq-TYPE (e2b:lq-Q4_K_M, a26b:lq-Q4_0: the files people pull) its SHAPE:Q8_0 source
#   quantize SHAPE:lq-TYPE specs of MODELS: llama.cpp's own llama-quantize SHAPE:Q8_0 -> TYPE (after the build;
#            Q4_K_M keeps the head, the PLE table and some layers in Q6_K), its log -> quantize.log;
#            DROP_SOURCES=1 then deletes the Q8_0 sources no spec of MODELS names itself (26B-A4B's is 27 GB of
#            the machine's 64: its Q4_0 and Q4_K_M beside it and the E2B files leave little room)
#   wait     wait for the build (until this call's time budget runs short)
#   ready    wait for the files a `models` step started in the background (setsid) is writing: each spec of
#            MODELS (an lq- spec's Q8_0 source) is done when FILE.ok exists (until the budget runs short;
#            never wait on `pgrep -f`: it matches the waiting command's own line)
#   llama    llama-bench -p PROMPT -n GEN -ngl 99 -o jsonl, one run per model
#   ours     bench/bench.py --kernels (native wgpu backend), PROMPT/GEN/CONTEXT/CHUNK
#   browser  bench/node_bench.mjs (Pyodide + Dawn in Node), one Node process per model
#   ttft     time to first token for a TTFT_PROMPT-token prompt (TTFT_MODELS): ours native and
#            llama-bench -p TTFT_PROMPT -n 0 (TTFT_BROWSER=1 adds the browser path)
#   stream   the STREAM_MODEL under each GPU memory budget of STREAM_BUDGETS (MiB): experts streamed
#            from the file into a cache; native and browser path, STREAM_PROMPT/STREAM_GEN tokens, 1 run;
#            beside them llama-bench with every expert on the CPU (-ncmoe 99), when built
#   skew     the stream runs again on a copy of STREAM_MODEL whose routers favor 16 experts per
#            layer (tools/skew_router.py): uniform routing is the worst case for the cache
#   sweep    bench/matvec_sweep.py (Q4_K: the old kernel by threads per row, the chunk kernel by
#            threads per row and workgroup) -> kernels.jsonl
#   mmsweep  bench/matmul_sweep.py: the prefill matmul by tile shape, natively and on the browser path
#            (node bench/node_bench.mjs --sweep) -> kernels.jsonl; MMSWEEP_ARGS: matmul_sweep.py's arguments
#            (native), MMSWEEP_BROWSER=0: native only
#   overlap  bench/overlap_probe.py natively and on the browser path (node_bench.mjs --overlap): whether two
#            dispatches that share no written buffer run at the same time -> kernels-overlap.jsonl
#   profile  bench/profile.py on each model, decode and prefill plans by kernel family -> kernels.jsonl
#   gpuprof  bench/gpu_profile.py (native) and node_bench.mjs --gpu-profile (browser path) on each model:
#            the decode step's GPU time by timestamp queries, per kernel family, beside its CPU
#            encoding and wall time (FEW=N: a speculative step instead) -> kernels.jsonl
#   diffusion  DiffusionGemma (issue 12): writes DIFFUSION_MODEL (tools/make_bench_model.py --shape
#            diffusion, 26B-A4B dimensions) if missing, then bench/bench.py natively, bench/node_bench.mjs
#            (browser path) and bench/bench.py --gpu-memory DIFFUSION_BUDGET (streamed experts, at most
#            DIFFUSION_STREAM_STEPS steps: every step reads most experts) -> diffusion-*.jsonl, then table
#   train    LoRA training (issue 13) of TRAIN_MODEL: bench/train_bench.py natively, bench/node_bench.mjs
#            --train (browser path) and bench/train_torch.py (PyTorch + PEFT, the machine's torch with the
#            transformers + peft wheels carried in .carry/train), each with nvidia-smi's memory.used
#            sampled every 100 ms (peak minus the value before) -> train-*.jsonl
#   speculate  speculative decoding (issue 9 item 4): SPEC_MODELS natively and on the browser path,
#            greedy, for each prompt kind of SPEC_PROMPTS (repeat: a random block of 16 ids repeated;
#            random) and each SPEC_N (0: off, the baseline; N: up to N prompt-lookup drafts a step):
#            decode tok/s with drafted, accepted, tokens_per_step -> speculate.jsonl, then table
#   drafter  an assistant drafter (issue 29 goal 4) on DRAFTER_MODEL, for each type of DRAFTER_QUANTS: writes
#            MODEL_DIR/bench-SHAPE-assistant-TYPE.gguf (tools/make_bench_drafter.py) if missing, then for each
#            DRAFTER_N (0: plain decoding, the baseline): ours natively (python -m pyapp bench --draft-model, --speculate N: decode tok/s, what a
#            round of N drafts costs, the acceptance that pays for it) and on the browser path (DRAFTER=...
#            node_bench.mjs), then llama.cpp's llama-speculative-simple --spec-type draft-mtp on the same two
#            files (greedy, -n GEN) when built -> drafter/*, llama.cpp's outputs also in drafter-llama.log
#   vision   image input (issue 28), for each shape of VISION_SHAPES (e2b a26b): writes the projector
#            MODEL_DIR/mmproj-bench-SHAPE.gguf (tools/make_vision_bench.py) if missing, then natively
#            bench/vision_bench.py (encode at each of VISION_BUDGETS, and the time to first token of a prompt
#            with one image on the MODELS file SHAPE:VISION_QUANT), the browser path where node was carried
#            (node bench/node_bench.mjs --vision; VISION_BROWSER=0: not), then llama-mtmd-cli on the same files
#            and image (img-BUDGET.png): -p "Describe." -n 1 with the image once, then VISION_IMAGES times in
#            one prompt (warm encodes), both -ngl 99 -c 8192 -b 2048 -ub 2048 --temp 0 --jinja -v
#            --image-max-tokens BUDGET (+ VISION_LLAMA_ARGS), parsed -> vision.jsonl, logs -> vision-llama.log
#   audio    audio input (issue 30), for each shape of AUDIO_SHAPES (e2b e4b: the same encoder, text width 1536 /
#            2560): writes the projector MODEL_DIR/mmproj-audio-bench-SHAPE.gguf (tools/make_audio_bench.py) if
#            missing and the clips $W/audio/clip-Ss.wav (S of AUDIO_SECONDS: a chirp, 16 kHz mono), then natively
#            bench/audio_bench.py (log-mel in Python, encode from samples with the features on the GPU to soft tokens, GPU time, and the time to first
#            token with the clip on the MODELS file SHAPE:AUDIO_QUANT), the browser path where node was carried
#            (node bench/node_bench.mjs --audio; AUDIO_BROWSER=0: not), then llama-mtmd-cli on the same files and
#            clip: AUDIO_FRESH fresh processes with the clip once, then one with it AUDIO_CLIPS times in one
#            prompt (warm encodes), all -p "Transcribe." -n 1 -ngl 99 -c 8192 -b 2048 -ub 2048 --temp 0 --jinja -v
#            (+ AUDIO_LLAMA_ARGS), parsed -> audio.jsonl, logs -> audio-llama.log. llama.cpp cuts audio into
#            30 s chunks (one encode a chunk): a clip of at most 30 s is one encode on both sides
#   table    bench/side_by_side.py over the results -> table.md
#   status   what is built, made and measured
#   all      setup build models wait llama ours browser ttft table (no 10-minute limit in mind)
#
# Every call ends by copying to $OUT (what comes back from the device): table.md, native.jsonl,
# browser.jsonl, llama.jsonl, ttft.jsonl, diffusion.jsonl, speculate.jsonl, vision.jsonl, vision-llama.log (the
# llama-mtmd-cli logs), audio.jsonl, audio-llama.log, h100.log (this script's output, all calls)
# and build.log.
# State lives in $W (/tmp/h100) and the models in /tmp: they persist only while the machine is
# held, and a machine goes back ~30 s after a call ends, so the calls must follow each other at
# once. Each call stops starting work BUDGET seconds (570) after it began; steps left undone are
# done by repeating the same command line. See bench/RESULTS.md, "How to reproduce".
#
# Env: MODELS ("e2b:Q4_K a26b:Q4_K"), PROMPT (512), GEN (128), CONTEXT (2048), CHUNK (512),
#      TTFT_PROMPT (4000), TTFT_MODELS ("e2b:Q4_K"), JOBS (14), BUDGET (570), REDO (0), CUDA (1; 0: a
#      CPU-only llama-bench, to try this script on a machine without a GPU), PYTHON (python3),
#      H100_WORK (/tmp/h100), MODEL_DIR (/tmp), LLAMA_ARGS (extra llama-bench arguments),
#      STREAM_MODEL (a26b:Q4_K), STREAM_BUDGETS ("8192 4096"), STREAM_PROMPT (128), STREAM_GEN (32),
#      SWEEP_ARGS (extra bench/matvec_sweep.py arguments), STREAM_TEMPERATURE (1: sampled tokens; greedy decoding of random weights repeats itself, and
#      so does its routing, which flatters a cache).
#      DIFFUSION_MODEL (diffusion:Q4_K), DIFFUSION_PROMPT (128), DIFFUSION_GEN (256: one canvas),
#      DIFFUSION_STEPS (empty: the model's 48), DIFFUSION_REPEAT (1: timed runs after a 2-step warm-up;
#      step_ms is the median over every step), DIFFUSION_BUDGET (8192 MiB; empty: no streamed run),
#      DIFFUSION_STREAM_STEPS (3), TRAIN_MODEL (e2b:Q4_K), TRAIN_SEQ (256), TRAIN_BATCH (4), TRAIN_RANK (8),
#      TRAIN_STEPS (6), TRAIN_DTYPES ("bfloat16 float32": PyTorch's base weights), A26B_DECODE ("native=69.7 browser=90.4": a26b Q4_K decode tok/s from
#      bench/RESULTS.md, 2026-11-23, shown beside the diffusion rows unless a26b records are in $RES).
#      SPEC_MODELS ("e2b:Q4_K"), SPEC_PROMPTS ("repeat random"), SPEC_N ("0 4 8 16"), SPEC_GEN (GEN).
#      INT8 (0: our engine on f32 activations throughout, Engine.open(int8=False): browser, gpuprof).
#      BUILD_TARGETS ("llama-bench llama-quantize llama-mtmd-cli"; llama-quantize and llama-mtmd-cli are left out
#      when the carried source has no tools/quantize or tools/mtmd), VISION_SHAPES ("e2b a26b"), VISION_BUDGETS ("280 1120"), VISION_QUANT (Q4_K), VISION_REPEAT (5),
#      VISION_IMAGES (4: images in llama-mtmd-cli's second run), VISION_LLAMA_ARGS (extra llama-mtmd-cli
#      arguments), VISION_BROWSER (1).
#      AUDIO_SHAPES ("e2b e4b"), AUDIO_SECONDS ("10 30"), AUDIO_QUANT (Q4_K), AUDIO_REPEAT (5), AUDIO_FRESH (3:
#      llama-mtmd-cli processes with the clip once), AUDIO_CLIPS (4: clips in its last run), AUDIO_LLAMA_ARGS,
#      AUDIO_BROWSER (1).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
W=${H100_WORK:-/tmp/h100}
RES=$W/results
OUT=${OUT:-$W/out}
MODEL_DIR=${MODEL_DIR:-/tmp}
MODELS=${MODELS:-"e2b:Q4_K a26b:Q4_K"}
PROMPT=${PROMPT:-512}
GEN=${GEN:-128}
CONTEXT=${CONTEXT:-2048}
CHUNK=${CHUNK:-512}
TTFT_PROMPT=${TTFT_PROMPT:-4000}
TTFT_MODELS=${TTFT_MODELS:-"e2b:Q4_K"}
JOBS=${JOBS:-14}
CUDA=${CUDA:-1}
BUDGET=${BUDGET:-570}
REDO=${REDO:-0}
LLAMA_ARGS=${LLAMA_ARGS:-}
STREAM_MODEL=${STREAM_MODEL:-a26b:Q4_K}
STREAM_BUDGETS=${STREAM_BUDGETS:-"8192 4096"}
STREAM_PROMPT=${STREAM_PROMPT:-128}
STREAM_GEN=${STREAM_GEN:-32}
STREAM_TEMPERATURE=${STREAM_TEMPERATURE:-1}
DIFFUSION_MODEL=${DIFFUSION_MODEL:-diffusion:Q4_K}
DIFFUSION_PROMPT=${DIFFUSION_PROMPT:-128}
DIFFUSION_GEN=${DIFFUSION_GEN:-256}
DIFFUSION_STEPS=${DIFFUSION_STEPS:-}
DIFFUSION_REPEAT=${DIFFUSION_REPEAT:-1}
DIFFUSION_BUDGET=${DIFFUSION_BUDGET-8192}
DIFFUSION_STREAM_STEPS=${DIFFUSION_STREAM_STEPS:-3}
A26B_DECODE=${A26B_DECODE-"native=69.7 browser=90.4"}
SPEC_MODELS=${SPEC_MODELS:-"e2b:Q4_K"}
SPEC_PROMPTS=${SPEC_PROMPTS:-"repeat random"}
SPEC_N=${SPEC_N:-"0 4 8 16"}
SPEC_GEN=${SPEC_GEN:-$GEN}
# (a later call without BUILD_TARGETS judges the build by the targets the build step was given: build.targets)
BUILD_TARGETS=${BUILD_TARGETS:-$(cat "$W/build.targets" 2>/dev/null || echo "llama-bench llama-quantize llama-mtmd-cli llama-speculative-simple")}
DRAFTER_MODEL=${DRAFTER_MODEL:-e2b:Q4_K}
DRAFTER_QUANTS=${DRAFTER_QUANTS:-"F16 Q8_0"}
DRAFTER_N=${DRAFTER_N:-"0 4 8"}
VISION_SHAPES=${VISION_SHAPES:-"e2b a26b"}
VISION_BUDGETS=${VISION_BUDGETS:-"280 1120"}
VISION_QUANT=${VISION_QUANT:-Q4_K}
VISION_REPEAT=${VISION_REPEAT:-5}
VISION_IMAGES=${VISION_IMAGES:-4}
VISION_LLAMA_ARGS=${VISION_LLAMA_ARGS:-}
AUDIO_SHAPES=${AUDIO_SHAPES:-"e2b e4b"}
AUDIO_SECONDS=${AUDIO_SECONDS:-"10 30"}
AUDIO_QUANT=${AUDIO_QUANT:-Q4_K}
AUDIO_REPEAT=${AUDIO_REPEAT:-5}
AUDIO_FRESH=${AUDIO_FRESH:-3}
AUDIO_CLIPS=${AUDIO_CLIPS:-4}
AUDIO_LLAMA_ARGS=${AUDIO_LLAMA_ARGS:-}
T0=$(date +%s)
mkdir -p "$W" "$RES" "$OUT"
exec > >(tee -a "$W/h100.log") 2>&1

log() { echo "[h100 $(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" >&2; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
# run a command with what is left of this call's budget (less a reserve), or skip it
limited() {
    local reserve=$1; shift
    local t=$(( $(left) - reserve ))
    if [ "$t" -lt 20 ]; then log "skipped (budget): $*"; return 124; fi
    timeout --kill-after=5 "$t" "$@"
}
model_path() { local shape=${1%%:*} quant=${1##*:}; echo "$MODEL_DIR/bench-$shape-$quant.gguf"; }
model_name() { basename "$(model_path "$1")" .gguf; }
# a result file is kept unless REDO=1; written to .tmp, moved into place when the command succeeds
done_already() { [ "$REDO" != 1 ] && [ -s "$1" ]; }

environment() {
    export PYTHONPATH=$W/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
    export PATH=$W/bin:$PATH
    for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do [ -x "$d/nvcc" ] && export PATH=$PATH:$d && break; done
    local icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    [ -f "$icd" ] && export VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd
    PY=${PYTHON:-python3}
}

# the targets to build: llama-mtmd-cli only where the carried source has tools/mtmd (bench/carry.sh adds it)
build_targets() {
    local t out=()
    for t in $BUILD_TARGETS; do
        [ "$t" = llama-mtmd-cli ] && [ -d "$W/llama.cpp" ] && [ ! -d "$W/llama.cpp/tools/mtmd" ] && continue
        [ "$t" = llama-quantize ] && [ -d "$W/llama.cpp" ] && [ ! -d "$W/llama.cpp/tools/quantize" ] && continue
        [ "$t" = llama-speculative-simple ] && [ -d "$W/llama.cpp" ] && [ ! -d "$W/llama.cpp/examples/speculative-simple" ] && continue
        out+=("$t")
    done
    echo "${out[*]}"
}

built() { local t; for t in $(build_targets); do [ -x "$W/build/bin/$t" ] || return 1; done; }

build_state() {   # none | running | ok | failed
    if built && [ "$(cat "$W/build.rc" 2>/dev/null)" = 0 ]; then echo ok
    elif [ -f "$W/build.rc" ]; then echo failed
    elif [ -f "$W/build.pid" ] && kill -0 "$(cat "$W/build.pid")" 2>/dev/null; then echo running
    else echo none; fi
}

step_setup() {
    if [ -d .carry/base ] && [ ! -f "$W/.base" ]; then
        log "setup: wheels, Vulkan loader, llama.cpp source, vocabulary"
        if ! "$PY" -c "import wgpu, gguf" 2>/dev/null; then
            "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$W/site" \
                .carry/base/whl/*.whl || return 1
        fi
        if ! ldconfig -p | grep -q 'libvulkan\.so\.1'; then
            for f in .carry/base/gl/*.deb; do dpkg -x "$f" /; done
            ldconfig
        fi
        rm -rf "$W/llama.cpp" && tar -xJf .carry/base/llama.cpp.tar.xz -C "$W" || return 1
        xz -dc .carry/base/vocab.gguf.xz > "$W/vocab.gguf" || return 1
        touch "$W/.base"
    fi
    # .carry/node's three parts may come in separate calls (the working tree and both carries exceed one
    # call's 64 MiB): node.xz in .carry/node or .carry/nodebin; each part is unpacked once, when it comes
    if [ ! -f "$W/.node" ]; then
        mkdir -p "$W/bin" "$W/pyodide" "$W/webgpu"
        # node.xz whole, or cut in two (.carry/nodebin/node.xz.0 and .carry/nodebin2/node.xz.1, carried apart)
        for f in .carry/node/node.xz .carry/nodebin/node.xz .carry/nodebin/node.xz.0; do
            [ -f "$f" ] || continue
            [ -x "$W/bin/node" ] && break
            parts=("$f")
            if [ "${f##*.}" = 0 ]; then
                [ -f .carry/nodebin2/node.xz.1 ] || { log "setup: node's second half (.carry/nodebin2) not carried yet"; continue; }
                parts+=(.carry/nodebin2/node.xz.1)
            fi
            log "setup: node"
            cat "${parts[@]}" | xz -dc > "$W/bin/node.part" && chmod +x "$W/bin/node.part" && mv "$W/bin/node.part" "$W/bin/node" || return 1
        done
        if [ -f .carry/node/pyodide.tar.xz ] && [ ! -f "$W/.pyodide" ]; then
            log "setup: Pyodide, Dawn"
            tar -xJf .carry/node/pyodide.tar.xz -C "$W/pyodide" && touch "$W/.pyodide" || return 1
            tar -xJf .carry/node/webgpu.tar.xz -C "$W/webgpu" || return 1
        fi
        [ -x "$W/bin/node" ] && [ -f "$W/.pyodide" ] && touch "$W/.node"
    fi
    [ -f "$W/.base" ] || { log "setup: .carry/base was not carried (bash bench/carry.sh, then carry it)"; return 1; }
    if [ ! -f "$W/.versions" ]; then
        {
            nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
            nvcc --version 2>&1 | tail -1
            cmake --version | head -1
            "$PY" --version
            "$PY" -c "import numpy, wgpu, gguf; print('numpy', numpy.__version__, 'wgpu', wgpu.__version__)"
            [ -x "$W/bin/node" ] && echo "node $("$W/bin/node" --version)"
            echo "llama.cpp from $(cat "$W/llama.cpp/SOURCE" 2>/dev/null)"
            nproc; free -g | head -2; df -h "$MODEL_DIR" | tail -1
        } > "$W/.versions" 2>&1
    fi
    cat "$W/.versions"
}

step_build() {
    case $(build_state) in
        ok) log "build: $(build_targets) already built"; return 0 ;;
        running) log "build: already running"; return 0 ;;
    esac
    [ -d "$W/llama.cpp" ] || { log "build: no llama.cpp source (setup first)"; return 1; }
    local gpu="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=$(command -v nvcc) -DGGML_CUDA_NCCL=OFF"
    if [ "$CUDA" = 0 ]; then gpu="-DGGML_CUDA=OFF"      # CPU-only: to check this script on a machine without CUDA
    else command -v nvcc >/dev/null || { log "build: no nvcc on PATH"; return 1; }; fi
    local gen=Ninja
    command -v ninja >/dev/null || gen="Unix Makefiles"
    rm -f "$W/build.rc"
    local targets examples=OFF
    targets=$(build_targets)
    echo "$BUILD_TARGETS" > "$W/build.targets"
    [ -d "$W/llama.cpp/examples/speculative-simple" ] && examples=ON      # carry.sh keeps that one example
    [ -d "$W/llama.cpp/tools/mtmd" ] || log "build: the carried llama.cpp has no tools/mtmd (an old .carry/base): no llama-mtmd-cli"
    log "build: $targets ($gpu, $gen) in the background, -j $JOBS, log $W/build.log"
    # setsid: its own process session, so it runs on after this call returns
    setsid nohup bash -c "
        set -o pipefail
        start=\$(date +%s)
        cmake -S '$W/llama.cpp' -B '$W/build' -G '$gen' -DCMAKE_BUILD_TYPE=Release $gpu \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=$examples -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
            -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF -DLLAMA_BUILD_COMMIT='$(cat "$W/llama.cpp/SOURCE")' \
        && cmake --build '$W/build' --target $targets -j $JOBS
        rc=\$?
        echo \"build finished: rc \$rc after \$(( \$(date +%s) - start )) s\"
        echo \$rc > '$W/build.rc'
    " > "$W/build.log" 2>&1 < /dev/null &
    echo $! > "$W/build.pid"
}

step_wait() {
    local s
    while [ "$(build_state)" = running ]; do
        if [ "$(left)" -lt 60 ]; then log "wait: build still running (budget): $(tail -1 "$W/build.log")"; return 0; fi
        sleep 15
        log "wait: $(tail -1 "$W/build.log" | cut -c1-150)"
    done
    s=$(build_state)
    log "wait: build $s"
    [ "$s" = failed ] && tail -40 "$W/build.log"
    [ "$s" = ok ]
}

step_ready() {
    local spec path
    for spec in $MODELS $TTFT_MODELS; do
        path=$(model_path "$(generated_spec "$spec")")
        while [ ! -f "$path.ok" ]; do
            if [ "$(left)" -lt 60 ]; then log "ready: $path not written yet (budget)"; return 1; fi
            sleep 5
        done
    done
    log "ready: every file of MODELS written"
}

# a spec's source for make_bench_model.py: SHAPE:lq-TYPE files are llama-quantize's, from SHAPE:Q8_0
generated_spec() { case ${1##*:} in lq-*) echo "${1%%:*}:Q8_0" ;; *) echo "$1" ;; esac; }

step_models() {
    local spec path pids=() specs=() i rc=0
    for spec in $MODELS $TTFT_MODELS; do
        spec=$(generated_spec "$spec")
        path=$(model_path "$spec")
        case " ${specs[*]} " in *" $spec "*) continue ;; esac
        [ -f "$path" ] && [ -f "$path.ok" ] && continue
        specs+=("$spec")
        log "models: $spec -> $path"
        ( limited 0 "$PY" tools/make_bench_model.py --shape "${spec%%:*}" --quant "${spec##*:}" \
              --vocab "$W/vocab.gguf" --out "$path.tmp" && mv "$path.tmp" "$path" && touch "$path.ok" ) &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do wait "${pids[$i]}" || { rc=1; log "models: ${specs[$i]} failed"; }; done
    ls -la "$MODEL_DIR"/bench-*.gguf 2>/dev/null
    return $rc
}

step_quantize() {
    local spec path src rc=0
    for spec in $MODELS $TTFT_MODELS; do
        case ${spec##*:} in lq-*) ;; *) continue ;; esac
        path=$(model_path "$spec")
        [ -f "$path" ] && [ -f "$path.ok" ] && continue
        [ -x "$W/build/bin/llama-quantize" ] || { log "quantize: llama-quantize not built ($(build_state))"; return 1; }
        src=$(model_path "$(generated_spec "$spec")")
        [ -f "$src.ok" ] || { log "quantize: $src missing (the models step first)"; rc=1; continue; }
        log "quantize: $src -> $path (${spec##*:lq-})"
        # --allow-requantize: the source is Q8_0, as a Q8_0 download would be
        if limited 0 "$W/build/bin/llama-quantize" --allow-requantize "$src" "$path.tmp" "${spec##*:lq-}" \
                >> "$W/quantize.log" 2>&1; then
            mv "$path.tmp" "$path" && touch "$path.ok"
            grep -E "model size|quant size" "$W/quantize.log" | tail -2
        else
            rc=1; log "quantize: $spec failed (tail of $W/quantize.log:)"; tail -5 "$W/quantize.log"
        fi
    done
    if [ "${DROP_SOURCES:-0}" = 1 ]; then
        for spec in $MODELS $TTFT_MODELS; do
            case ${spec##*:} in lq-*) ;; *) continue ;; esac
            src=$(generated_spec "$spec")
            case " $MODELS $TTFT_MODELS " in *" $src "*) continue ;; esac       # wanted for itself
            path=$(model_path "$src")
            [ -f "$path" ] && { log "quantize: dropping the source $path"; rm -f "$path" "$path.ok"; }
        done
    fi
    log "quantize: $(df -h --output=avail /tmp | tail -1 | tr -d ' ') left on /tmp"
    return $rc
}

# measurements wait for the build: it takes 14 of 16 cores, and our engine encodes on the CPU
busy() {
    [ "$(build_state)" = running ] || return 1
    if [ "${ALLOW_BUSY:-0}" = 1 ]; then log "WARNING: the llama.cpp build is still running: CPU-bound timings are off"; return 1; fi
    log "$1: skipped while the llama.cpp build runs (repeat this command; ALLOW_BUSY=1 measures anyway)"
}

step_llama() {
    local spec path res
    busy llama && return 1
    [ "$(build_state)" = ok ] || { log "llama: llama-bench not built ($(build_state))"; return 1; }
    for spec in $MODELS; do
        path=$(model_path "$spec"); res=$RES/llama-$(model_name "$spec").jsonl
        done_already "$res" && continue
        [ -f "$path.ok" ] || { log "llama: no $path"; continue; }
        log "llama: $spec"
        # shellcheck disable=SC2086
        limited 20 "$W/build/bin/llama-bench" -m "$path" -p "$PROMPT" -n "$GEN" -ngl 99 -o jsonl $LLAMA_ARGS \
            > "$res.tmp" && mv "$res.tmp" "$res"
        cat "$res" 2>/dev/null
    done
}

step_ours() {
    local spec path res
    busy ours && return 1
    for spec in $MODELS; do
        path=$(model_path "$spec"); res=$RES/native-$(model_name "$spec").jsonl
        done_already "$res" && continue
        [ -f "$path.ok" ] || { log "ours: no $path"; continue; }
        log "ours (native): $spec"
        # --kernels: matvec GB/s per quant type first; the best one gives bound_tok_s
        limited 20 "$PY" bench/bench.py --kernels --models "$path" --prompt-tokens "$PROMPT" --gen-tokens "$GEN" \
            --context "$CONTEXT" --chunk "$CHUNK" > "$res.tmp" && mv "$res.tmp" "$res"
        cat "$res" 2>/dev/null
    done
}

step_browser() {
    local spec path res
    [ -x "$W/bin/node" ] || { log "browser: no node (carry .carry/node)"; return 1; }
    busy browser && return 1
    for spec in $MODELS; do
        path=$(model_path "$spec"); res=$RES/browser-$(model_name "$spec").jsonl
        done_already "$res" && continue
        [ -f "$path.ok" ] || { log "browser: no $path"; continue; }
        log "browser (Pyodide + Dawn in Node): $spec"
        PROMPT_TOKENS=$PROMPT GEN_TOKENS=$GEN CONTEXT=$CONTEXT CHUNK=$CHUNK PYODIDE_DIR=$W/pyodide WEBGPU_DIR=$W/webgpu \
            limited 20 "$W/bin/node" bench/node_bench.mjs "$path" > "$res.tmp" && mv "$res.tmp" "$res"
        cat "$res" 2>/dev/null
    done
}

step_ttft() {
    local spec path res ctx=$(( (TTFT_PROMPT * 2 + 1023) / 1024 * 1024 ))
    busy ttft && return 1
    for spec in $TTFT_MODELS; do
        path=$(model_path "$spec")
        [ -f "$path.ok" ] || { log "ttft: no $path"; continue; }
        res=$RES/ttft-native-$(model_name "$spec").jsonl
        if ! done_already "$res"; then
            log "ttft (native): $spec, $TTFT_PROMPT-token prompt"
            limited 20 "$PY" bench/bench.py --models "$path" --prompt-tokens "$TTFT_PROMPT" --gen-tokens 4 \
                --context "$ctx" --chunk "$CHUNK" > "$res.tmp" && mv "$res.tmp" "$res"
            cat "$res" 2>/dev/null
        fi
        res=$RES/ttft-llama-$(model_name "$spec").jsonl
        if [ "$(build_state)" = ok ] && ! done_already "$res"; then
            log "ttft (llama.cpp): $spec"
            # shellcheck disable=SC2086
            limited 20 "$W/build/bin/llama-bench" -m "$path" -p "$TTFT_PROMPT" -n 0 -ngl 99 -o jsonl $LLAMA_ARGS \
                > "$res.tmp" && mv "$res.tmp" "$res"
            cat "$res" 2>/dev/null
        fi
        res=$RES/ttft-browser-$(model_name "$spec").jsonl
        if [ "${TTFT_BROWSER:-0}" = 1 ] && [ -x "$W/bin/node" ] && ! done_already "$res"; then
            log "ttft (browser): $spec"
            PROMPT_TOKENS=$TTFT_PROMPT GEN_TOKENS=4 CONTEXT=$ctx CHUNK=$CHUNK PYODIDE_DIR=$W/pyodide WEBGPU_DIR=$W/webgpu \
                limited 20 "$W/bin/node" bench/node_bench.mjs "$path" > "$res.tmp" && mv "$res.tmp" "$res"
            cat "$res" 2>/dev/null
        fi
    done
}

step_stream() {
    local path
    busy stream && return 1
    path=$(model_path "$STREAM_MODEL")
    [ -f "$path.ok" ] || { log "stream: no $path"; return 1; }
    stream_runs "$path"
}

# skew: the same runs on a copy of STREAM_MODEL whose routers favor 16 experts per layer
# (tools/skew_router.py): random routers are uniform, the worst case for a cache
step_skew() {
    local path skewed
    busy skew && return 1
    path=$(model_path "$STREAM_MODEL")
    skewed=${path%.gguf}-skew.gguf
    [ -f "$path.ok" ] || { log "skew: no $path"; return 1; }
    if [ ! -f "$skewed.ok" ]; then
        log "skew: $skewed"
        cp "$path" "$skewed.tmp" && "$PY" tools/skew_router.py "$skewed.tmp" && mv "$skewed.tmp" "$skewed" \
            && touch "$skewed.ok" || return 1
    fi
    stream_runs "$skewed"
}

stream_runs() {
    local path=$1 b res name
    name=$(basename "$path" .gguf)
    # llama.cpp's answer to a small GPU: every MoE layer's experts in RAM, computed by the CPU (-ncmoe 99)
    res=$RES/stream-llama-$name.jsonl
    if [ "$(build_state)" = ok ] && ! done_already "$res"; then
        log "stream (llama.cpp, experts on the CPU): $name"
        limited 20 "$W/build/bin/llama-bench" -m "$path" -p "$STREAM_PROMPT" -n "$STREAM_GEN" -ngl 99 -ncmoe 99 -r 3 \
            -o jsonl > "$res.tmp" && mv "$res.tmp" "$res"
        cat "$res" 2>/dev/null
    fi
    for b in $STREAM_BUDGETS; do
        res=$RES/stream-native-$name-$b.jsonl
        if ! done_already "$res"; then
            log "stream (native): $name, --gpu-memory $b"
            limited 20 "$PY" bench/bench.py --models "$path" --prompt-tokens "$STREAM_PROMPT" --gen-tokens "$STREAM_GEN" \
                --repeat 1 --context "$CONTEXT" --chunk "$CHUNK" --gpu-memory "$b" --temperature "$STREAM_TEMPERATURE" \
                > "$res.tmp" && mv "$res.tmp" "$res"
            cat "$res" 2>/dev/null
        fi
        res=$RES/stream-browser-$name-$b.jsonl
        if [ -x "$W/bin/node" ] && ! done_already "$res"; then
            log "stream (browser): $name, GPU_MEMORY=$b"
            GPU_MEMORY=$b PROMPT_TOKENS=$STREAM_PROMPT GEN_TOKENS=$STREAM_GEN REPEAT=1 CONTEXT=$CONTEXT CHUNK=$CHUNK \
                TEMPERATURE=$STREAM_TEMPERATURE \
                PYODIDE_DIR=$W/pyodide WEBGPU_DIR=$W/webgpu \
                limited 20 "$W/bin/node" bench/node_bench.mjs "$path" > "$res.tmp" && mv "$res.tmp" "$res"
            cat "$res" 2>/dev/null
        fi
    done
}

# DiffusionGemma (issue 12): the model if missing (as step_models makes one), then native, the browser
# path and native with streamed experts; each result kept unless REDO=1
step_diffusion() {
    local spec=$DIFFUSION_MODEL path name res steps=() ctx=$(( DIFFUSION_PROMPT + DIFFUSION_GEN + 256 ))
    path=$(model_path "$spec"); name=$(model_name "$spec")
    busy diffusion && return 1
    if [ ! -f "$path.ok" ]; then
        log "diffusion: $spec -> $path"
        limited 0 "$PY" tools/make_bench_model.py --shape "${spec%%:*}" --quant "${spec##*:}" \
            --vocab "$W/vocab.gguf" --out "$path.tmp" && mv "$path.tmp" "$path" && touch "$path.ok" \
            || { log "diffusion: making $path failed"; return 1; }
        ls -la "$path"
    fi
    [ -n "$DIFFUSION_STEPS" ] && steps=(--steps "$DIFFUSION_STEPS")
    res=$RES/diffusion-native-$name.jsonl
    if ! done_already "$res"; then
        log "diffusion (native): $name, prompt $DIFFUSION_PROMPT, $DIFFUSION_GEN new tokens"
        limited 20 "$PY" bench/bench.py --models "$path" --prompt-tokens "$DIFFUSION_PROMPT" \
            --gen-tokens "$DIFFUSION_GEN" --repeat "$DIFFUSION_REPEAT" --context "$ctx" --chunk "$CHUNK" "${steps[@]}" \
            > "$res.tmp" && mv "$res.tmp" "$res"
        cat "$res" 2>/dev/null
    fi
    res=$RES/diffusion-browser-$name.jsonl
    if [ ! -x "$W/bin/node" ]; then
        log "diffusion (browser): no node (carry .carry/node)"
    elif ! done_already "$res"; then
        log "diffusion (browser): $name"
        PROMPT_TOKENS=$DIFFUSION_PROMPT GEN_TOKENS=$DIFFUSION_GEN REPEAT=$DIFFUSION_REPEAT STEPS=$DIFFUSION_STEPS \
            CONTEXT=$ctx CHUNK=$CHUNK PYODIDE_DIR=$W/pyodide WEBGPU_DIR=$W/webgpu \
            limited 20 "$W/bin/node" bench/node_bench.mjs "$path" > "$res.tmp" && mv "$res.tmp" "$res"
        cat "$res" 2>/dev/null
    fi
    res=$RES/diffusion-native-$name-$DIFFUSION_BUDGET.jsonl
    if [ -n "$DIFFUSION_BUDGET" ] && ! done_already "$res"; then
        log "diffusion (native): $name, --gpu-memory $DIFFUSION_BUDGET, $DIFFUSION_STREAM_STEPS steps"
        limited 20 "$PY" bench/bench.py --models "$path" --prompt-tokens "$DIFFUSION_PROMPT" \
            --gen-tokens "$DIFFUSION_GEN" --repeat 1 --context "$ctx" --chunk "$CHUNK" \
            --steps "$DIFFUSION_STREAM_STEPS" --gpu-memory "$DIFFUSION_BUDGET" > "$res.tmp" && mv "$res.tmp" "$res"
        cat "$res" 2>/dev/null
    fi
    res=$RES/diffusion-browser-$name-$DIFFUSION_BUDGET.jsonl
    if [ -n "$DIFFUSION_BUDGET" ] && [ -x "$W/bin/node" ] && ! done_already "$res"; then
        log "diffusion (browser): $name, GPU_MEMORY=$DIFFUSION_BUDGET, $DIFFUSION_STREAM_STEPS steps"
        GPU_MEMORY=$DIFFUSION_BUDGET PROMPT_TOKENS=$DIFFUSION_PROMPT GEN_TOKENS=$DIFFUSION_GEN REPEAT=1 \
            STEPS=$DIFFUSION_STREAM_STEPS CONTEXT=$ctx CHUNK=$CHUNK PYODIDE_DIR=$W/pyodide WEBGPU_DIR=$W/webgpu \
            limited 20 "$W/bin/node" bench/node_bench.mjs "$path" > "$res.tmp" && mv "$res.tmp" "$res"
        cat "$res" 2>/dev/null
    fi
    step_table
}

# speculative decoding: greedy decode speed with up to N drafts a step (0: the baseline), per prompt kind,
# natively and on the browser path; each result kept unless REDO=1
step_speculate() {
    local spec path name kind n res
    busy speculate && return 1
    mkdir -p "$RES/speculate"      # apart: side_by_side.py's main table would take the N = 0 runs as its own
    for spec in $SPEC_MODELS; do
        path=$(model_path "$spec"); name=$(model_name "$spec")
        [ -f "$path.ok" ] || { log "speculate: no $path"; continue; }
        for kind in $SPEC_PROMPTS; do
            for n in $SPEC_N; do
                res=$RES/speculate/native-$name-$kind-$n.jsonl
                if ! done_already "$res"; then
                    log "speculate (native): $name, $kind prompt, --speculate $n"
                    limited 20 "$PY" bench/bench.py --models "$path" --prompt-tokens "$PROMPT" --gen-tokens "$SPEC_GEN" \
                        --context "$CONTEXT" --chunk "$CHUNK" --speculate "$n" --prompt-kind "$kind" \
                        > "$res.tmp" && mv "$res.tmp" "$res"
                    cat "$res" 2>/dev/null
                fi
                res=$RES/speculate/browser-$name-$kind-$n.jsonl
                if [ -x "$W/bin/node" ] && ! done_already "$res"; then
                    log "speculate (browser): $name, $kind prompt, SPECULATE=$n"
                    SPECULATE=$n PROMPT_KIND=$kind PROMPT_TOKENS=$PROMPT GEN_TOKENS=$SPEC_GEN CONTEXT=$CONTEXT \
                        CHUNK=$CHUNK PYODIDE_DIR=$W/pyodide WEBGPU_DIR=$W/webgpu \
                        limited 20 "$W/bin/node" bench/node_bench.mjs "$path" > "$res.tmp" && mv "$res.tmp" "$res"
                    cat "$res" 2>/dev/null
                fi
            done
        done
    done
    step_table
}

# an assistant drafter beside its target (issue 29 goal 4): ours natively and on the browser path, then
# llama.cpp's llama-speculative-simple (--spec-type draft-mtp) on the same target and drafter files
step_drafter() {
    local shape=${DRAFTER_MODEL%%:*} target name q drafter n res
    busy drafter && return 1
    mkdir -p "$RES/drafter"
    target=$(text_model drafter "$DRAFTER_MODEL")
    [ -n "$target" ] || return 1
    name=$(model_name "$DRAFTER_MODEL")
    for q in $DRAFTER_QUANTS; do
        drafter=$MODEL_DIR/bench-$shape-assistant-$q.gguf
        make_once "$drafter" drafter "$PY" tools/make_bench_drafter.py --target "$shape" --quant "$q" || continue
        for n in $DRAFTER_N; do
            res=$RES/drafter/native-$name-$q-$n.jsonl
            if ! done_already "$res"; then
                log "drafter (native): $name + $q drafter, $n drafts a step"
                # N = 0: the baseline, plain decoding (--draft-model alone would draft 4 a step)
                limited 20 "$PY" -m pyapp bench "$target" --json --prompt-tokens "$PROMPT" --decode-tokens "$GEN" \
                    --context "$CONTEXT" --prompt-step "$CHUNK" --speculate "$n" \
                    $([ "$n" = 0 ] || echo --draft-model "$drafter") > "$res.tmp" && tail -1 "$res.tmp" > "$res"
                cat "$res" 2>/dev/null
            fi
            res=$RES/drafter/browser-$name-$q-$n.jsonl
            if [ -x "$W/bin/node" ] && ! done_already "$res"; then
                log "drafter (browser): $name + $q drafter, SPECULATE=$n"
                DRAFTER=$drafter SPECULATE=$n PROMPT_TOKENS=$PROMPT GEN_TOKENS=$GEN CONTEXT=$CONTEXT CHUNK=$CHUNK \
                    PYODIDE_DIR=$W/pyodide WEBGPU_DIR=$W/webgpu \
                    limited 20 "$W/bin/node" bench/node_bench.mjs "$target" > "$res.tmp" && mv "$res.tmp" "$res"
                cat "$res" 2>/dev/null
            fi
            res=$RES/drafter/llama-$name-$q-$n.txt
            if [ -x "$W/build/bin/llama-speculative-simple" ] && ! done_already "$res"; then
                log "drafter (llama.cpp): $name + $q drafter, --spec-draft-n-max $n"
                limited 20 "$W/build/bin/llama-speculative-simple" -m "$target" -md "$drafter" --spec-type draft-mtp \
                    --spec-draft-n-max "$n" -ngl 99 -ngld 99 -c "$CONTEXT" -n "$GEN" --temp 0 \
                    -p "$(printf 'the %.0s' $(seq 1 100))" > "$res.tmp" 2>&1
                grep -E "decoded|encoded|n_drafted|n_accept|accept " "$res.tmp" && mv "$res.tmp" "$res"
                { echo "== $name + $q drafter, n $n"; cat "$res.tmp" "$res" 2>/dev/null; } >> "$RES/drafter-llama.log"
            fi
        done
    done
}

# FILE made once by COMMAND ... --out FILE.tmp (FILE.ok marks it made); STEP names the step in the log
make_once() {
    local file=$1 step=$2; shift 2
    [ -f "$file.ok" ] && return 0
    log "$step: $file"
    limited 0 "$@" --out "$file.tmp" && mv "$file.tmp" "$file" && touch "$file.ok" && return 0
    log "$step: making $file failed"; return 1
}

# the path of the MODELS file SPEC where the models step made it, else nothing (and a word in the log)
text_model() {
    local step=$1 spec=$2 path
    path=$(model_path "$spec")
    if [ -f "$path.ok" ]; then echo "$path"; else log "$step: no $path (the models step, with $spec in MODELS)"; fi
}

# image input (issue 28): ours natively, then llama-mtmd-cli, on the same projector, text model and image
step_vision() {
    local shape mmproj text res b img one many base rc
    busy vision && return 1
    mkdir -p "$W/vision" "$RES/vision"
    for shape in $VISION_SHAPES; do
        mmproj=$MODEL_DIR/mmproj-bench-$shape.gguf
        make_once "$mmproj" vision "$PY" tools/make_vision_bench.py --shape "$shape" || continue
        text=$(text_model vision "$shape:$VISION_QUANT")
        res=$RES/vision/ours-$shape.jsonl
        if ! done_already "$res"; then
            log "vision (ours, native): $shape, budgets $VISION_BUDGETS"
            # shellcheck disable=SC2086
            limited 20 "$PY" bench/vision_bench.py --mmproj "$mmproj" ${text:+--text "$text"} --budgets $VISION_BUDGETS \
                --repeat "$VISION_REPEAT" --png-dir "$W/vision" > "$res.tmp" && mv "$res.tmp" "$res"
            cat "$res.tmp" "$res" 2>/dev/null
        fi
        for b in $VISION_BUDGETS; do         # the images (the native run writes them): the browser path and llama.cpp read them
            # shellcheck disable=SC2086
            [ -f "$W/vision/img-$b.png" ] || { "$PY" bench/vision_bench.py --mmproj "$mmproj" --budgets $VISION_BUDGETS \
                --png-dir "$W/vision" --png-only; break; }
        done
        res=$RES/vision/browser-$shape.jsonl
        if [ "${VISION_BROWSER:-1}" = 1 ] && [ -x "$W/bin/node" ] && [ -f "$W/.node" ] && ! done_already "$res"; then
            log "vision (ours, browser path: Pyodide + Dawn in Node): $shape, budgets $VISION_BUDGETS"
            VISION_BUDGETS=$VISION_BUDGETS VISION_REPEAT=$VISION_REPEAT VISION_PNG_DIR=$W/vision PYODIDE_DIR=$W/pyodide \
                WEBGPU_DIR=$W/webgpu limited 20 "$W/bin/node" bench/node_bench.mjs --vision "$mmproj" ${text:+"$text"} \
                > "$res.tmp" && mv "$res.tmp" "$res"
            cat "$res.tmp" "$res" 2>/dev/null
        fi
        for b in $VISION_BUDGETS; do
            img=$W/vision/img-$b.png
            [ -x "$W/build/bin/llama-mtmd-cli" ] || { log "vision: llama-mtmd-cli not built ($(build_state))"; break; }
            [ -n "$text" ] || break
            res=$RES/vision/llama-$shape-$b.jsonl
            done_already "$res" && continue
            base=$RES/vision/llama-$shape-$b
            one=$base-one.log; many=$base-many.log
            log "vision (llama-mtmd-cli): $shape, budget $b: the image once, then $VISION_IMAGES times in one prompt"
            # shellcheck disable=SC2086
            limited 20 "$W/build/bin/llama-mtmd-cli" -m "$text" --mmproj "$mmproj" --image "$img" -p "Describe." -n 1 \
                -ngl 99 -c 8192 -b 2048 -ub 2048 --temp 0 --image-max-tokens "$b" --jinja -v $VISION_LLAMA_ARGS \
                > "$one" 2>&1 < /dev/null
            rc=$?
            echo "[rc $rc]" >> "$one"
            # shellcheck disable=SC2086
            limited 20 "$W/build/bin/llama-mtmd-cli" -m "$text" --mmproj "$mmproj" $(printf -- '--image %s ' $(yes "$img" | head -n "$VISION_IMAGES")) \
                -p "Describe." -n 1 -ngl 99 -c 8192 -b 2048 -ub 2048 --temp 0 --image-max-tokens "$b" --jinja -v \
                $VISION_LLAMA_ARGS > "$many" 2>&1 < /dev/null
            echo "[rc $?]" >> "$many"
            "$PY" bench/vision_bench.py --llama "$one" "$many" --images "$VISION_IMAGES" \
                --label "{\"runtime\": \"llama.cpp\", \"shape\": \"$shape\", \"budget\": $b, \"text\": \"$(basename "$text")\", \"mmproj\": \"$(basename "$mmproj")\", \"rc\": $rc}" \
                > "$res.tmp" || continue
            # a record that says what went wrong is kept apart (vision-*.err.jsonl): a repeated call measures again
            if grep -q '"error"\|"many_error"' "$res.tmp"; then mv "$res.tmp" "$base.err.jsonl"; else mv "$res.tmp" "$res"; fi
            cat "$res" "$base.err.jsonl" 2>/dev/null
            grep -E "encoding done|image decoded|prompt eval time|error|failed|abort|invalid argument" "$one" "$many" \
                | grep -v "control-looking" | head -30
        done
    done
}

# audio input (issue 30): ours natively (and on the browser path), then llama-mtmd-cli, on the same projector,
# text model and clips
step_audio() {
    local shape mmproj text res sec wav base i r rc ones many llama=(-ngl 99 -c 8192 -b 2048 -ub 2048 --temp 0 --jinja -v)
    busy audio && return 1
    mkdir -p "$W/audio" "$RES/audio"
    # shellcheck disable=SC2086
    "$PY" bench/audio_bench.py --seconds $AUDIO_SECONDS --wav-dir "$W/audio" --wav-only || { log "audio: no clips"; return 1; }
    for shape in $AUDIO_SHAPES; do
        mmproj=$MODEL_DIR/mmproj-audio-bench-$shape.gguf
        make_once "$mmproj" audio "$PY" tools/make_audio_bench.py --shape "$shape" || continue
        text=$(text_model audio "$shape:$AUDIO_QUANT")
        res=$RES/audio/ours-$shape.jsonl
        if ! done_already "$res"; then
            log "audio (ours, native): $shape, clips of $AUDIO_SECONDS s"
            # shellcheck disable=SC2086
            limited 20 "$PY" bench/audio_bench.py --mmproj "$mmproj" ${text:+--text "$text"} --seconds $AUDIO_SECONDS \
                --repeat "$AUDIO_REPEAT" --wav-dir "$W/audio" > "$res.tmp" && mv "$res.tmp" "$res"
            cat "$res.tmp" "$res" 2>/dev/null
        fi
        res=$RES/audio/browser-$shape.jsonl
        if [ "${AUDIO_BROWSER:-1}" = 1 ] && [ -x "$W/bin/node" ] && [ -f "$W/.node" ] && ! done_already "$res"; then
            log "audio (ours, browser path: Pyodide + Dawn in Node): $shape, clips of $AUDIO_SECONDS s"
            AUDIO_SECONDS=$AUDIO_SECONDS AUDIO_REPEAT=$AUDIO_REPEAT AUDIO_WAV_DIR=$W/audio PYODIDE_DIR=$W/pyodide \
                WEBGPU_DIR=$W/webgpu limited 20 "$W/bin/node" bench/node_bench.mjs --audio "$mmproj" ${text:+"$text"} \
                > "$res.tmp" && mv "$res.tmp" "$res"
            cat "$res.tmp" "$res" 2>/dev/null
        fi
        for sec in $AUDIO_SECONDS; do
            wav=$W/audio/clip-${sec}s.wav
            [ -x "$W/build/bin/llama-mtmd-cli" ] || { log "audio: llama-mtmd-cli not built ($(build_state))"; break; }
            [ -n "$text" ] || break
            res=$RES/audio/llama-$shape-${sec}s.jsonl
            done_already "$res" && continue
            base=$RES/audio/llama-$shape-${sec}s
            log "audio (llama-mtmd-cli): $shape, ${sec} s: the clip once in $AUDIO_FRESH processes, then $AUDIO_CLIPS times in one prompt"
            ones=(); rc=0
            for i in $(seq 1 "$AUDIO_FRESH"); do
                ones+=("$base-one-$i.log")
                # shellcheck disable=SC2086
                limited 20 "$W/build/bin/llama-mtmd-cli" -m "$text" --mmproj "$mmproj" --audio "$wav" -p "Transcribe." -n 1 \
                    "${llama[@]}" $AUDIO_LLAMA_ARGS > "$base-one-$i.log" 2>&1 < /dev/null
                r=$?; [ "$r" = 0 ] || rc=$r
                echo "[rc $r]" >> "$base-one-$i.log"
            done
            many=$base-many.log
            # shellcheck disable=SC2086
            limited 20 "$W/build/bin/llama-mtmd-cli" -m "$text" --mmproj "$mmproj" $(printf -- '--audio %s ' $(yes "$wav" | head -n "$AUDIO_CLIPS")) \
                -p "Transcribe." -n 1 "${llama[@]}" $AUDIO_LLAMA_ARGS > "$many" 2>&1 < /dev/null
            echo "[rc $?]" >> "$many"
            "$PY" bench/audio_bench.py --llama "${ones[@]}" --many "$many" --clips "$AUDIO_CLIPS" \
                --label "{\"runtime\": \"llama.cpp\", \"shape\": \"$shape\", \"seconds\": $sec, \"wav\": \"$(basename "$wav")\", \"text\": \"$(basename "$text")\", \"mmproj\": \"$(basename "$mmproj")\", \"rc\": $rc}" \
                > "$res.tmp" || continue
            # a record that says what went wrong is kept apart (*.err.jsonl): a repeated call measures again
            if grep -q '"error"\|"many_error"' "$res.tmp"; then mv "$res.tmp" "$base.err.jsonl"; else mv "$res.tmp" "$res"; fi
            cat "$res" "$base.err.jsonl" 2>/dev/null
            grep -E "encoding done|slice encoded|audio decoded|prompt eval time|error|failed|abort|invalid argument" "${ones[@]}" "$many" \
                | grep -v "control-looking" | head -30
        done
    done
}

step_table() {
    local a=() kv
    for kv in $A26B_DECODE; do a+=(--a26b-decode "$kv"); done
    [ -d "$RES/speculate" ] && a+=(--speculation "$RES/speculate")
    "$PY" bench/side_by_side.py --prompt "$PROMPT" --gen "$GEN" --ttft-prompt "$TTFT_PROMPT" "${a[@]}" "$RES" \
        > "$RES/table.md" && cat "$RES/table.md"
}

step_sweep() {
    local res=$RES/kernels-sweep.jsonl
    busy sweep && return 1
    done_already "$res" && return 0
    log "sweep: Q4_K decode matvec variants"
    # shellcheck disable=SC2086
    limited 20 "$PY" bench/matvec_sweep.py --quants q4_k ${SWEEP_ARGS:-} > "$res.tmp" && mv "$res.tmp" "$res"
    cat "$res" 2>/dev/null
}

step_mmsweep() {
    local res=$RES/kernels-mmsweep-native.jsonl
    busy mmsweep && return 1
    if ! done_already "$res"; then
        log "mmsweep: prefill matmul tiles, native"
        # shellcheck disable=SC2086
        limited 20 "$PY" bench/matmul_sweep.py ${MMSWEEP_ARGS:-} > "$res.tmp" && mv "$res.tmp" "$res"
        cat "$res" 2>/dev/null
    fi
    [ "${MMSWEEP_BROWSER:-1}" = 1 ] || return 0
    res=$RES/kernels-mmsweep-browser.jsonl
    [ -x "$W/bin/node" ] || { log "mmsweep: no node (carry .carry/node)"; return 1; }
    done_already "$res" && return 0
    log "mmsweep: prefill matmul tiles, browser path"
    PYODIDE_DIR=$W/pyodide WEBGPU_DIR=$W/webgpu limited 20 "$W/bin/node" bench/node_bench.mjs --sweep > "$res.tmp" \
        && mv "$res.tmp" "$res"
    cat "$res" 2>/dev/null
}

step_overlap() {
    local res=$RES/kernels-overlap.jsonl
    busy overlap && return 1
    done_already "$res" && return 0
    log "overlap: do independent dispatches overlap (native, then the browser path)"
    { limited 5 "$PY" bench/overlap_probe.py
      [ -x "$W/bin/node" ] && PYODIDE_DIR=$W/pyodide WEBGPU_DIR=$W/webgpu limited 5 "$W/bin/node" bench/node_bench.mjs --overlap
    } > "$res.tmp" && mv "$res.tmp" "$res"
    cat "$res" 2>/dev/null
}

step_profile() {
    local spec path res
    busy profile && return 1
    for spec in $MODELS; do
        path=$(model_path "$spec"); res=$RES/kernels-profile-$(model_name "$spec").jsonl
        done_already "$res" && continue
        [ -f "$path.ok" ] || { log "profile: no $path"; continue; }
        log "profile: $spec (decode, then a prefill chunk)"
        { limited 20 "$PY" bench/profile.py "$path" && limited 20 "$PY" bench/profile.py "$path" --prefill; } \
            > "$res.tmp" && mv "$res.tmp" "$res"
        cat "$res" 2>/dev/null
    done
}

smi_peak() {   # smi_peak OUTFILE LABEL CMD...: run CMD, then append nvidia-smi's peak memory.used rise as a JSON line
    local out=$1 label=$2; shift 2
    local log=$W/smi.$$.log base peak
    base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$log" 2>/dev/null &
    local smi=$!
    "$@"
    local rc=$?
    kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
    peak=$(sort -n "$log" 2>/dev/null | tail -1)
    [ -n "$base" ] && [ -n "$peak" ] && echo "{\"kind\": \"smi\", \"what\": \"$label\", \"gpu_mib_before\": $base, \"gpu_mib_peak\": $peak}" >> "$out"
    rm -f "$log"
    return $rc
}

step_train() {
    local spec=${TRAIN_MODEL:-e2b:Q4_K} path res args dtype
    local seq=${TRAIN_SEQ:-256} batch=${TRAIN_BATCH:-4} rank=${TRAIN_RANK:-8} steps=${TRAIN_STEPS:-6}
    busy train && return 1
    path=$(model_path "$spec")
    res=$RES/train-$(model_name "$spec")
    args="--seq-len $seq --batch $batch --rank $rank --steps $steps"
    # ours needs the model file; PyTorch builds the shape itself (so .carry/node and .carry/train can go in two calls)
    [ -f "$path.ok" ] || log "train: no $path (MODELS must include $spec): PyTorch only"
    if [ -f "$path.ok" ] && ! done_already "$res-native.jsonl"; then
        log "train (native): $spec $args"
        smi_peak "$res-native.jsonl.tmp" native limited 20 "$PY" bench/train_bench.py "$path" $args >> "$res-native.jsonl.tmp" \
            && mv "$res-native.jsonl.tmp" "$res-native.jsonl"
        cat "$res-native.jsonl" 2>/dev/null
    fi
    if [ -f "$path.ok" ] && [ -x "$W/bin/node" ] && ! done_already "$res-browser.jsonl"; then
        log "train (browser path): $spec"
        SEQ_LEN=$seq BATCH=$batch RANK=$rank STEPS=$steps CONTEXT=$seq PYODIDE_DIR=$W/pyodide WEBGPU_DIR=$W/webgpu \
            smi_peak "$res-browser.jsonl.tmp" browser limited 20 "$W/bin/node" bench/node_bench.mjs --train "$path" \
            >> "$res-browser.jsonl.tmp" && mv "$res-browser.jsonl.tmp" "$res-browser.jsonl"
        cat "$res-browser.jsonl" 2>/dev/null
    fi
    if [ -d .carry/train ] && [ ! -d "$W/site-train" ]; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$W/site-train" .carry/train/*.whl
    fi
    for dtype in ${TRAIN_DTYPES:-bfloat16 float32}; do
        done_already "$res-torch-$dtype.jsonl" && continue
        log "train (PyTorch + PEFT, $dtype): ${spec%%:*}"
        PYTHONPATH=$W/site-train:$PYTHONPATH smi_peak "$res-torch-$dtype.jsonl.tmp" "torch $dtype" \
            limited 20 "$PY" bench/train_torch.py --shape "${spec%%:*}" $args --dtype "$dtype" \
            >> "$res-torch-$dtype.jsonl.tmp" && mv "$res-torch-$dtype.jsonl.tmp" "$res-torch-$dtype.jsonl"
        cat "$res-torch-$dtype.jsonl" 2>/dev/null
    done
}

step_gpuprof() {
    local spec path res
    busy gpuprof && return 1
    for spec in $MODELS; do
        path=$(model_path "$spec")
        [ -f "$path.ok" ] || { log "gpuprof: no $path"; continue; }
        res=$RES/kernels-gpuprof-native-$(model_name "$spec").jsonl
        if ! done_already "$res"; then
            log "gpuprof: $spec, native (timestamp queries)"
            FEW=${FEW:-0} limited 20 "$PY" bench/gpu_profile.py "$path" ${FEW:+--few $FEW} > "$res.tmp" && mv "$res.tmp" "$res"
            cat "$res" 2>/dev/null
        fi
        res=$RES/kernels-gpuprof-browser-$(model_name "$spec").jsonl
        [ -x "$W/bin/node" ] || { log "gpuprof: no node (carry .carry/node)"; continue; }
        done_already "$res" && continue
        log "gpuprof: $spec, browser path (timestamp queries)"
        PYODIDE_DIR=$W/pyodide WEBGPU_DIR=$W/webgpu FEW=${FEW:-0} limited 20 "$W/bin/node" bench/node_bench.mjs \
            --gpu-profile "$path" > "$res.tmp" && mv "$res.tmp" "$res"
        cat "$res" 2>/dev/null
    done
}
step_status() {
    log "build: $(build_state); $(tail -1 "$W/build.log" 2>/dev/null)"
    ls -la "$MODEL_DIR"/bench-*.gguf 2>/dev/null
    ls -la "$RES" 2>/dev/null
}

finish() {   # what comes back: the files in $OUT
    local kind
    step_table > /dev/null 2>&1
    for kind in native browser llama ttft stream kernels diffusion train; do
        cat "$RES/$kind"-*.jsonl > "$OUT/$kind.jsonl" 2>/dev/null || rm -f "$OUT/$kind.jsonl"
    done
    cat "$RES"/speculate/*.jsonl > "$OUT/speculate.jsonl" 2>/dev/null || rm -f "$OUT/speculate.jsonl"
    cat "$RES"/drafter/*.jsonl > "$OUT/drafter.jsonl" 2>/dev/null || rm -f "$OUT/drafter.jsonl"
    [ -f "$RES/drafter-llama.log" ] && tail -c 4000000 "$RES/drafter-llama.log" > "$OUT/drafter-llama.log"
    cat "$RES"/vision/*.jsonl > "$OUT/vision.jsonl" 2>/dev/null || rm -f "$OUT/vision.jsonl"
    if ls "$RES"/vision/*.log >/dev/null 2>&1; then
        for f in "$RES"/vision/*.log; do echo "==== $(basename "$f")"; cat "$f"; done | tail -c 8000000 > "$OUT/vision-llama.log"
    fi
    cat "$RES"/audio/*.jsonl > "$OUT/audio.jsonl" 2>/dev/null || rm -f "$OUT/audio.jsonl"
    if ls "$RES"/audio/*.log >/dev/null 2>&1; then
        for f in "$RES"/audio/*.log; do echo "==== $(basename "$f")"; cat "$f"; done | tail -c 8000000 > "$OUT/audio-llama.log"
    fi
    cp "$RES/table.md" "$OUT/" 2>/dev/null
    [ -f "$W/build.log" ] && tail -c 8000000 "$W/build.log" > "$OUT/build.log"
    [ -f "$W/quantize.log" ] && tail -c 2000000 "$W/quantize.log" > "$OUT/quantize.log"
    log "call done; build $(build_state)"
    sleep 0.2
    tail -c 8000000 "$W/h100.log" > "$OUT/h100.log"
}

environment
trap finish EXIT
[ $# -gt 0 ] || set -- status
for s in "$@"; do
    [ "$s" = all ] && set -- setup build models wait llama ours browser ttft table && break
done
for s in "$@"; do
    case $s in
        setup|build|models|ready|quantize|wait|llama|ours|browser|ttft|stream|skew|sweep|mmsweep|overlap|profile|gpuprof|diffusion|speculate|drafter|train|vision|audio|table|status) ;;
        *) echo "unknown step: $s (see the head of $0)"; exit 2 ;;
    esac
done
rc=0
for s in "$@"; do
    log "== $s (budget left $(left) s)"
    "step_$s" || { rc=1; log "$s: failed or incomplete"; }
done
exit $rc
