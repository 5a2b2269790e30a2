"""moolib-examples: example agents for moolib on today's Python.

moolib itself is built by scripts/build_moolib.py (its only registry release does not build
as is); `make install` runs that first, so the pinned requirement below is already met.
"""

import setuptools

setuptools.setup(
    name="moolib-examples",
    version="0.1.0",
    description="A2C and V-trace (IMPALA) example agents for moolib",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["examples", "examples.*"]),
    package_data={"examples.vtrace": ["*.yaml", "hydra/launcher/*.yaml"]},
    install_requires=[
        "torch>=2.0",
        "moolib==0.0.9b0",
        "numpy>=1.24",
        "gymnasium>=1.0",
        "ale-py>=0.9",
        "opencv-python-headless>=4.8",  # AtariFrames resizes frames with cv2
        "minatar>=1.0.15",
        "hydra-core>=1.3",
        "omegaconf>=2.3",
        "wandb>=0.16",
        "plotext>=6",
        "matplotlib>=3.7",
        "imageio>=2.31",
        "imageio-ffmpeg>=0.4",
        "pygame>=2.1",  # gymnasium renders classic-control envs (evaluate video=) with it
        "psutil>=5.9",
        # Many peers as one Slurm array job (or local processes): -m hydra/launcher=...
        "hydra-submitit-launcher>=1.2",
        "submitit>=1.5",
        "tensorboard>=2.14",  # tensorboard=true writes logs.tsv's scalars for TensorBoard too
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-timeout>=2.2", "ruff>=0.6"],
        "bench": ["stable-baselines3>=2.3"],
    },
)
