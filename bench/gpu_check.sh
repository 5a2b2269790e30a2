#!/usr/bin/env bash
# The GPU check of issue 12, in one run of at most 10 minutes on a machine with one GPU, about 16
# cores, Python 3.12 with a CUDA build of torch, nvcc, cmake and ninja, and no network:
#
#   1. installs the examples' packages from WHEELS (made here by bench/gpu_wheels.sh);
#   2. builds moolib with CUDA (scripts/build_moolib.py, its sdist also from WHEELS);
#   3. runs the test suite's CUDA test (tests/unit/test_vtrace.py::test_cuda_matches_cpu);
#   4. measures the learner on the GPU in fp32 and bf16, then runs one V-trace peer of the seed's
#      command (env.name=ALE/Breakout-v5, default batch sizes, device=cuda:0, one EnvPool process
#      per core) for RUN_SECONDS, and prints its agent steps per second next to published
#      figures (bench/gpu_run.py).
#
# Known obstacle (2026-11-30, checked on the CPU machine with nvcc 13.0 and torch 2.14.1+cu130):
# torch 2.14's headers require C++20, and moolib 0.0.9b0's sources do not compile as C++20
# (src/function.h: use of deleted Storage()). With torch <= 2.13 (C++17) that does not arise.
#
#   bench/gpu_check.sh              # on the GPU machine
#   bench/gpu_check.sh --dry-run    # on a CPU: device=cpu, tiny sizes, every step in a few minutes
#
# Environment: PYTHON (default python3.12; its environment receives the packages), WHEELS
# (default bench/gpu-wheels), RUN_SECONDS (default 240), OUT (where gpu_results.json goes;
# default bench/), MOOLIB_WHEEL_CACHE (build_moolib.py's).
set -euo pipefail
cd "$(dirname "$0")/.."
dry_run=0
case "${1:-}" in
    "") ;;
    --dry-run) dry_run=1 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (expected nothing or --dry-run)" >&2; exit 2 ;;
esac
python=${PYTHON:-python3.12}
wheels=$(realpath -m "${WHEELS:-bench/gpu-wheels}")
# Into the device tool's $OUT where there is one, so that the figures come back.
results=$(realpath -m "${OUT:-bench}/gpu_results.json")
start=$SECONDS
step() { echo "[gpu_check $((SECONDS - start)) s] $*"; }

if ! command -v "$python" >/dev/null; then
    echo "gpu_check.sh: $python not found (set PYTHON)" >&2; exit 2
fi
if ! ls "$wheels"/moolib-*.tar.gz >/dev/null 2>&1; then
    echo "gpu_check.sh: no moolib sdist in $wheels: run bench/gpu_wheels.sh first" >&2; exit 2
fi
cuda=$("$python" -c "import torch; print(int(torch.cuda.is_available()))") || {
    echo "gpu_check.sh: $python cannot import torch" >&2; exit 2; }
if [[ $dry_run == 0 && $cuda != 1 ]]; then
    echo "gpu_check.sh: torch in $python sees no GPU; use --dry-run on a CPU" >&2; exit 2
fi
"$python" -c "import torch, platform; print('python', platform.python_version(), 'torch', \
torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if \
torch.cuda.is_available() else 'no GPU')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

# No network: pip takes everything from the folder, the moolib build's own pip calls too.
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$wheels" PIP_BREAK_SYSTEM_PACKAGES=1
export PIP_DISABLE_PIP_VERSION_CHECK=1

step "installing packages from $wheels"
"$python" -m pip install -q gymnasium ale-py opencv-python-headless hydra-core omegaconf plotext \
    psutil numpy pytest pytest-timeout
# Without its plotting dependencies, which gpu_wheels.sh leaves out: its envs do not need them.
"$python" -m pip install -q --no-deps minatar

step "building moolib (CUDA $([[ $dry_run == 1 ]] && echo off || echo on))"
if [[ $dry_run == 1 ]]; then
    USE_CUDA=0 "$python" scripts/build_moolib.py
else
    # What the CUDA build needed on a machine with nvcc 13 (seen on the CPU machine, where nvcc
    # is a wrapper in /usr/local/bin): cmake finds the toolkit from nvcc's folder, so the
    # toolkit's own bin/ comes first; torch's cmake files ask for libnvrtc.so, which a toolkit
    # may lack but torch's CUDA wheel brings (as libnvrtc.so.13); and one architecture, this
    # GPU's, instead of torch's list (faster, and CUDA 13 no longer builds for sm_50).
    if [[ -z ${CUDA_HOME:-} ]]; then
        CUDA_HOME=$(dirname "$(dirname "$(realpath "$(command -v nvcc)")")")
        # A wrapper script's folder is no toolkit: take the usual place then.
        [[ -f $CUDA_HOME/include/cuda_runtime.h ]] || CUDA_HOME=/usr/local/cuda
    fi
    export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"
    if ! ls "$CUDA_HOME"/lib64/libnvrtc.so "$CUDA_HOME"/lib/libnvrtc.so >/dev/null 2>&1; then
        nvrtc=$("$python" -c "import glob, os, torch; print((glob.glob(os.path.join(\
os.path.dirname(torch.__file__), '..', 'nvidia', '*', 'lib', 'libnvrtc.so.*[0-9]')) + [''])[0])")
        if [[ -n $nvrtc ]]; then
            mkdir -p /tmp/gpu-check-lib && ln -sf "$nvrtc" /tmp/gpu-check-lib/libnvrtc.so
            export CMAKE_LIBRARY_PATH=/tmp/gpu-check-lib
        fi
    fi
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$("$python" -c \
        "import torch; print('%d.%d' % torch.cuda.get_device_capability(0))")}
    echo "CUDA_HOME=$CUDA_HOME TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
    USE_CUDA=1 "$python" scripts/build_moolib.py
fi

step "the CUDA test"
test_out=$("$python" -m pytest -q -rs -p no:cacheprovider \
    "tests/unit/test_vtrace.py::test_cuda_matches_cpu" 2>&1) || { echo "$test_out"; exit 1; }
echo "$test_out" | tail -3
if [[ $dry_run == 0 ]] && ! grep -q "1 passed" <<<"$test_out"; then
    echo "gpu_check.sh: the CUDA test did not run" >&2; exit 1
fi

if [[ $dry_run == 1 ]]; then
    step "one peer, device=cpu, tiny sizes"
    "$python" -m bench.gpu_run --device cpu --tiny --seconds "${RUN_SECONDS:-20}" --warmup 10 \
        --out "$results"
else
    step "learner and one peer on cuda:0"
    "$python" -m bench.gpu_run --device cuda:0 --seconds "${RUN_SECONDS:-240}" --warmup 45 \
        --out "$results"
fi
step "done"
