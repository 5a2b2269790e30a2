#!/usr/bin/env python
"""Check, on a machine without a GPU, that moolib builds with CUDA against today's CUDA torch.

For each torch version, in a throwaway venv: torch's CUDA build and NVIDIA's CUDA compiler and
runtime headers of torch's CUDA version from the package index (the "cuda-toolkit" packages,
not a system toolkit), scripts/build_moolib.py with USE_CUDA=1 and an empty wheel cache,
`import moolib`, then the unit tests (those that need a GPU skip). It ends with one line per
version: built or not, and the first compiler error if not.

    python scripts/cuda_build_check.py                      # torch 2.13.0 and 2.14.1
    python scripts/cuda_build_check.py --torch 2.14.1 --keep
    make cuda-build-check

Not part of CI: each version downloads about 3 GB (less with pip's cache), needs 6-7 GB of
disk while it runs and about 30 minutes on 2 cores. Nothing is left outside --workdir
except pip's own cache and the project's egg-info (as `make install` writes it).
"""

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_TORCH = ["2.13.0", "2.14.1"]
# The parts of NVIDIA's toolkit that a build of moolib needs: the compiler, the runtime library
# and headers, and the headers nvcc itself includes. (CUDA 12's toolkit has no "crt" and "nvvm"
# extras; pip warns and carries on.)
TOOLKIT_EXTRAS = "nvcc,cudart,cccl,crt,nvvm"
ERROR = re.compile(r"error:|CMake Error|undefined reference|fatal error|#error", re.IGNORECASE)


def say(message):
    print(f"[cuda_build_check] {message}", flush=True)


def run(cmd, log, env=None, echo=None):
    """Run cmd with its output appended to log; lines that match echo are shown too."""
    with open(log, "a") as out:
        out.write("$ " + " ".join(map(str, cmd)) + "\n")
        out.flush()
        proc = subprocess.Popen(
            [str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=env, cwd=REPO,
        )  # fmt: skip
        for line in proc.stdout:
            out.write(line)
            if echo and re.search(echo, line):
                print("    " + line.rstrip(), flush=True)
        return proc.wait()


def first_error(log):
    """The first compiler, linker or cmake error in a log, on one line."""
    lines = pathlib.Path(log).read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        if ERROR.search(line) and "ERROR: Failed" not in line and "error: subprocess" not in line:
            text = line.strip()
            if "CMake Error" in text:
                # cmake says what went wrong on the lines that follow.
                text += " " + " ".join(x.strip() for x in lines[i + 1 : i + 4] if x.strip())
            return text[:400]
    tail = [x.strip() for x in lines if x.strip()]
    return tail[-1][:400] if tail else "no output"


def without_other_toolkits(path):
    """PATH minus folders with an nvcc in them: the build must find the venv's toolkit."""
    keep = [d for d in path.split(os.pathsep) if d and not (pathlib.Path(d) / "nvcc").exists()]
    return os.pathsep.join(keep)


def folder_size(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            file = pathlib.Path(root) / name
            if not file.is_symlink():
                total += file.stat().st_size
    return total


def check(version, args):
    """(passed, the result line) for one torch version."""
    work = args.workdir / f"torch-{version}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # The logs stay when the rest of the folder goes (without --keep).
    logs = args.workdir / f"logs-torch-{version}"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir()
    log = logs / "check.log"
    venv = work / "venv"
    py = venv / "bin" / "python"
    started = time.time()
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "CUDACXX")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{without_other_toolkits(env.get('PATH', ''))}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    # torch from the package indexes only: in a find-links folder (pip config), a CPU wheel
    # "2.13.0+cpu" would satisfy torch==2.13.0 and win over the index's CUDA build.
    no_links = work / "no-find-links"
    no_links.mkdir()
    torch_env = dict(env, PIP_FIND_LINKS=str(no_links))
    pip = [py, "-m", "pip", "install", "-q"]

    def line(outcome, ok=False):
        minutes = (time.time() - started) / 60
        size = folder_size(work) / 1e9
        return ok, f"torch {version}: {outcome} ({minutes:.0f} min, {size:.1f} GB in {work})"

    say(f"torch {version}: venv in {venv}, logs in {logs}")
    if run([args.python, "-m", "venv", venv], log):
        return line(f"not built: could not make a venv: {first_error(log)}")
    say(f"torch {version}: installing torch ({args.torch_spec.format(version=version)})")
    if run(pip + ["numpy", args.torch_spec.format(version=version)], log, torch_env):
        return line(f"not built: torch did not install: {first_error(log)}")
    facts = subprocess.run(
        [py, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
        capture_output=True, text=True, env=env,
    ).stdout.split()  # fmt: skip
    if len(facts) != 2 or facts[1] == "None":
        return line(f"not built: pip installed no CUDA build of torch ({' '.join(facts)})")
    torch_version, cuda = facts
    toolkit = f"cuda-toolkit[{TOOLKIT_EXTRAS}]=={cuda}.*"
    say(f"torch {version}: torch {torch_version}, CUDA {cuda}; installing {toolkit}, cmake, ninja")
    if run(pip + [toolkit, "cmake", "ninja"], log, env):
        return line(f"not built: the CUDA toolkit did not install: {first_error(log)}")
    build_env = dict(
        env,
        USE_CUDA="1",
        MOOLIB_WHEEL_CACHE=str(work / "wheel-cache"),
        CMAKE_BUILD_PARALLEL_LEVEL=str(args.jobs),
    )
    say(f"torch {version}: building moolib with CUDA ({args.jobs} jobs)")
    build_log = logs / "build.log"
    if run([py, REPO / "scripts" / "build_moolib.py"], build_log, build_env, r"^\[build_moolib\]"):
        return line(f"not built: {first_error(build_log)}")
    used = re.search(r"CUDA [\d.]+ toolkit at (.+)", build_log.read_text())
    where = "pip" if used and str(venv) in used.group(1) else used.group(1) if used else "?"
    probe = "import moolib, moolib._C as c; moolib.Rpc(); print(c.__file__)"
    out = subprocess.run([py, "-c", probe], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        err = (out.stderr.strip().splitlines() or ["?"])[-1]
        return line(f"built, but import moolib fails: {err}")
    needed = subprocess.run(
        ["readelf", "-d", out.stdout.strip()], capture_output=True, text=True
    ).stdout
    cuda_libs = sorted(set(re.findall(r"\[(libtorch_cuda\.so|libcudart\.so[.\d]*)\]", needed)))
    outcome = f"built with CUDA {cuda} (toolkit from {where}), imports"
    outcome += f", links {' '.join(cuda_libs)}" if cuda_libs else ", links no CUDA library"
    if args.no_tests:
        return line(outcome, ok=True)
    say(f"torch {version}: installing the test dependencies, running tests/unit")
    if run(pip + ["-e", f"{REPO}[test]"], log, env):
        return line(f"{outcome}; test dependencies did not install: {first_error(log)}")
    test_log = logs / "tests.log"
    failed = run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit"], test_log, env)
    summary = [x for x in test_log.read_text().splitlines() if re.search(r" in [\d.]+s", x)]
    summary = summary[-1].strip("= ") if summary else "no summary"
    return line(f"{outcome}; unit tests: {summary}", ok=not failed)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--torch", nargs="+", default=DEFAULT_TORCH, help="torch versions to check")
    p.add_argument(
        "--torch-spec",
        default="torch=={version}",
        help="the requirement pip installs, e.g. 'torch=={version}' (default)",
    )
    p.add_argument("--workdir", type=pathlib.Path, default=pathlib.Path("/tmp/moolib-cuda-check"))
    p.add_argument("--python", default=sys.executable, help="the venvs' interpreter")
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    p.add_argument("--keep", action="store_true", help="keep each version's folder")
    p.add_argument("--no-tests", action="store_true", help="build and import only")
    args = p.parse_args(argv)
    args.workdir = args.workdir.resolve()
    results = []
    for version in args.torch:
        try:
            results.append(check(version, args))
        except KeyboardInterrupt:
            results.append((False, f"torch {version}: interrupted"))
            break
        finally:
            if not args.keep:
                shutil.rmtree(args.workdir / f"torch-{version}", ignore_errors=True)
        say(results[-1][1])
    print()
    for _, result in results:
        print(result)
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
