#!/usr/bin/env bash
# Fill a folder with what bench/gpu_check.sh installs on a machine without network: wheels of the
# examples' run-time packages for one Python version (3.12 by default, the GPU machine's), pytest,
# the build requirements of moolib, and moolib's sdist. torch is not among them: the GPU machine
# has its own CUDA build. Nor is OpenCV (opencv-python-headless is 54 MiB; the folder and the
# checkout must fit in 64 MiB): bench/cv2_standin stands in for the one call the envs make.
#
#     bench/gpu_wheels.sh [DIR] [PYTHON_VERSION]     # default: bench/gpu-wheels 3.12
#
# The folder is git-ignored; send it with the run (the device tool's carry: bench/gpu-wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-bench/gpu-wheels}
version=${2:-3.12}
python=${PYTHON:-.venv/bin/python}
if ! [[ $version =~ ^3\.[0-9]+$ ]]; then
    echo "gpu_wheels.sh: PYTHON_VERSION must look like 3.12, got '$version'" >&2
    exit 2
fi
mkdir -p "$dir"
# Only what a V-trace peer, the CUDA test and the build need; not wandb, matplotlib or imageio.
packages=(
    "gymnasium>=1.0" "ale-py>=0.9"
    "plotext>=6" "psutil>=5.9" numpy PyYAML packaging
    "pybind11>=2.12,<3" setuptools wheel "pytest>=8" "pytest-timeout>=2.2"
)
target=(--python-version "$version" --implementation cp --platform manylinux2014_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
"$python" -m pip download -q --dest "$dir" --only-binary=:all: "${target[@]}" "${packages[@]}"
# hydra-core needs antlr4-python3-runtime 4.9.*, which exists only as an sdist: build its
# (pure-Python) wheel here, and take hydra-core and omegaconf without resolving their deps.
# MinAtar's plotting dependencies (matplotlib, seaborn, scipy, pandas: 70 MB) are left out:
# its envs run without them.
"$python" -m pip download -q --dest "$dir" --only-binary=:all: "${target[@]}" --no-deps \
    "hydra-core>=1.3" "omegaconf>=2.3,<2.4" "minatar>=1.0.15"
"$python" -m pip wheel -q --wheel-dir "$dir" --no-deps "antlr4-python3-runtime==4.9.*"
# The sdist that scripts/build_moolib.py builds from (it asks pip for it by name).
moolib=$("$python" -c "import sys; sys.path.insert(0, 'scripts'); import build_moolib; print(build_moolib.MOOLIB_VERSION)")
"$python" -m pip download -q --dest "$dir" --no-deps --no-binary :all: "moolib==$moolib"
# A folder made before OpenCV was left out still has its wheel: not needed, and too big.
rm -f "$dir"/opencv_python*.whl
echo "gpu_wheels.sh: $(ls "$dir" | wc -l) files, $(du -sh "$dir" | cut -f1) in $dir (Python $version)"
