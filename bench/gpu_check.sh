#!/usr/bin/env bash
# The GPU check of issues 12 and 20, in one run of at most 10 minutes (about 8) on a machine with
# one GPU, about 16 cores, Python 3.12 with a CUDA build of torch, nvcc, cmake and ninja, and no
# network. Its files arrive as one folder of at most 64 MiB: the checkout (1 MB) and WHEELS
# (about 35 MB: no OpenCV, see bench/gpu_wheels.sh).
#
#   1. installs the examples' packages from WHEELS (made here by bench/gpu_wheels.sh); where
#      no cv2 is installed, bench/cv2_standin stands in for it (the same frames, slower);
#   2. builds moolib with CUDA (scripts/build_moolib.py, its sdist also from WHEELS; it finds
#      the toolkit from nvcc and applies the C++20 fixes for torch >= 2.14 and the CUDA ones);
#   3. runs the test suite's CUDA test (tests/unit/test_vtrace.py::test_cuda_matches_cpu);
#   4. measures the learner on the GPU for both Atari nets (atari_net=resnet and nature) in fp32,
#      TF32 and bf16, then runs one V-trace peer of the seed's command (env.name=ALE/Breakout-v5,
#      default batch sizes, device=cuda:0, one EnvPool process per core) for RUN_SECONDS, and
#      prints its agent steps per second next to published figures (bench/gpu_run.py).
#
# Step 2 was compiled, linked and imported on a CPU machine without a GPU (2026-12-01,
# scripts/cuda_build_check.py: torch 2.13.0+cu130 and 2.14.1+cu130 with NVIDIA's pip CUDA 13.0
# toolkit; the unit tests passed with both builds); steps 3 and 4 have never run on a GPU, and
# the 8 minutes are an estimate.
#
#   bench/gpu_check.sh              # on the GPU machine
#   bench/gpu_check.sh --dry-run    # on a CPU: device=cpu, tiny sizes, every step in a few minutes
#
# Environment: PYTHON (default python3.12; its environment receives the packages), WHEELS
# (default bench/gpu-wheels), RUN_SECONDS (default 150), OUT (where gpu_results.json goes;
# default bench/), MOOLIB_WHEEL_CACHE (build_moolib.py's), TORCH_CUDA_ARCH_LIST (default: this
# GPU's).
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
"$python" -m pip install -q gymnasium ale-py hydra-core omegaconf plotext psutil numpy pytest \
    pytest-timeout
# Without its plotting dependencies, which gpu_wheels.sh leaves out: its envs do not need them.
"$python" -m pip install -q --no-deps minatar
if ! "$python" -c "import cv2" 2>/dev/null; then
    # A path file rather than PYTHONPATH, which bench/processes.py sets for the peers it starts.
    # Its folder comes after site-packages on sys.path: an OpenCV installed later still wins.
    site=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    echo "$PWD/bench/cv2_standin" >"$site/moolib_examples_cv2_standin.pth"
    echo "no cv2 installed: bench/cv2_standin/cv2.py resizes the Atari frames ($site)"
fi

step "building moolib (CUDA $([[ $dry_run == 1 ]] && echo off || echo on))"
if [[ $dry_run == 1 ]]; then
    USE_CUDA=0 "$python" scripts/build_moolib.py
else
    # build_moolib.py finds the toolkit (from nvcc, a wrapper script too, or $CUDA_HOME) and
    # the unversioned libraries cmake asks for. One architecture, this GPU's, instead of
    # torch's list: faster, and CUDA 13 no longer builds for the oldest ones.
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$("$python" -c \
        "import torch; print('%d.%d' % torch.cuda.get_device_capability(0))")}
    echo "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
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
    "$python" -m bench.gpu_run --device cuda:0 --seconds "${RUN_SECONDS:-150}" --warmup 30 \
        --out "$results"
fi
step "done"
