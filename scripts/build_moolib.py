#!/usr/bin/env python
"""Build (or reuse) a moolib wheel that works on today's toolchain, and install it.

moolib's only registry release is the 0.0.9b0 sdist, which does not build with current
cmake, Python 3.11 and libstdc++ as shipped. This script is the one place that knows how to
make it build: it downloads that sdist by name, applies eight small fixes (each explained in
apply_fixes: three make it build, one changes how tensorpipe polls at run time, so that an
idle moolib process no longer keeps a core busy, one makes the installed extension find the
torch of the venv it is installed in, one makes the broker end cleanly on SIGINT and SIGTERM,
one builds without debug information, and one keeps an unreachable network from aborting
the process; CPU builds also leave out tensorpipe's cma channel, which moolib never registers,
and compile tensorpipe as a unity build, to build faster), builds a wheel against the torch
already installed in this interpreter, caches it, and pip-installs it.
Against torch >= 2.14, whose headers need C++20, it applies two more (cxx20_fixes); with
CUDA, one more (cuda_fixes), and against a CUDA build of torch one more (cuda_torch_fixes);
it finds the CUDA toolkit itself (find_toolkit: a system one, or NVIDIA's pip packages in
this venv).

    python scripts/build_moolib.py            # build or reuse, then install
    USE_CUDA=1 python scripts/build_moolib.py # force the CUDA build (needs nvcc + CUDA torch)
    python scripts/build_moolib.py --rebuild  # ignore the cache

The cache lives in $MOOLIB_WHEEL_CACHE (default ~/.cache/moolib-examples/wheels), one folder
per (moolib version, Python version, torch version, CUDA off or torch's CUDA version, fix
revisions).
"""

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time

MOOLIB_VERSION = "0.0.9b0"
# Bump whenever the fixes below change: it is part of the cache key.
FIX_REVISION = 7
# The fixes that only CUDA builds get, and those that only C++20 builds get, have revisions of
# their own, which are in the keys of those builds only: changing them leaves CPU wheels for
# torch 2.13 valid.
CUDA_FIX_REVISION = 1
CXX20_FIX_REVISION = 1
# The first torch whose headers refuse anything older than C++20.
CXX20_TORCH = (2, 14)
PYBIND11_REQUIREMENT = "pybind11>=2.12,<3"
MIN_CMAKE = (3, 12)


class BuildError(RuntimeError):
    pass


def log(message):
    print(f"[build_moolib] {message}", flush=True)


def run(cmd, **kwargs):
    log("$ " + " ".join(str(c) for c in cmd))
    try:
        subprocess.run([str(c) for c in cmd], check=True, **kwargs)
    except subprocess.CalledProcessError as e:
        raise BuildError(f"command failed with exit code {e.returncode}: {cmd[0]} ...") from None


def torch_info():
    try:
        import torch
    except ImportError:
        raise BuildError(
            f"torch is not installed in {sys.executable}; install it first "
            "(e.g. `pip install torch==2.13.0`, or `make install`)"
        ) from None
    return torch.__version__, torch.version.cuda


def needs_cxx20(torch_version):
    match = re.match(r"(\d+)\.(\d+)", torch_version)
    return bool(match) and tuple(int(x) for x in match.groups()) >= CXX20_TORCH


def nvcc_facts(nvcc):
    """(toolkit root, CUDA version "major.minor") of an nvcc, or None if it does not run.

    The root comes from nvcc itself (its TOP): nvcc on PATH is often a wrapper script or a link
    somewhere else, e.g. /usr/local/bin/nvcc running /usr/local/cuda-13.0/bin/nvcc."""
    try:
        version = subprocess.run(
            [nvcc, "--version"], capture_output=True, text=True, timeout=60
        ).stdout
        dry = subprocess.run(
            [nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    release = re.search(r"release (\d+\.\d+)", version)
    top = re.search(r"^#\$ TOP=(.+)$", dry.stdout + dry.stderr, re.MULTILINE)
    if not release:
        return None
    root = pathlib.Path(top.group(1).strip()).resolve() if top else None
    if root is None or not (root / "include" / "cuda_runtime.h").is_file():
        root = pathlib.Path(nvcc).resolve().parent.parent
    return root, release.group(1)


def toolkit_candidates():
    """Where a CUDA toolkit may be, most explicit first: $CUDA_HOME (or $CUDA_PATH), nvcc on
    PATH, then NVIDIA's pip packages installed in this interpreter (nvidia/cu13/bin/nvcc from
    `pip install "cuda-toolkit[nvcc,cudart,cccl,crt,nvvm]"`)."""
    found = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            found.append(pathlib.Path(os.environ[var]) / "bin" / "nvcc")
    if shutil.which("nvcc"):
        found.append(pathlib.Path(shutil.which("nvcc")))
    site = pathlib.Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    found += sorted(site.glob("cu*/bin/nvcc"), reverse=True)
    return [nvcc for nvcc in dict.fromkeys(found) if nvcc.is_file()]


def find_toolkit(torch_cuda):
    """The (root, version) of the first toolkit whose CUDA major version is torch's, or None.

    A toolkit of another major version would compile against one CUDA runtime while torch
    loads another (libcudart.so.12 beside .13); torch's own extension builder refuses that too.
    """
    seen = []
    for nvcc in toolkit_candidates():
        facts = nvcc_facts(nvcc)
        if facts is None:
            continue
        if facts[1].split(".")[0] == str(torch_cuda).split(".")[0]:
            return facts
        seen.append(f"CUDA {facts[1]} at {facts[0]}")
    if seen:
        raise BuildError(
            f"torch is built with CUDA {torch_cuda} but the CUDA toolkits found are "
            f"{', '.join(seen)}; install a CUDA {str(torch_cuda).split('.')[0]}.x toolkit "
            "(or set CUDA_HOME to one)"
        )
    return None


def want_cuda(torch_cuda):
    """The toolkit to build with (root, version), or None for a CPU build."""
    requested = os.environ.get("USE_CUDA")
    if requested is not None and requested != "":
        on = requested.strip().upper() not in ("0", "OFF", "FALSE", "NO")
        if not on:
            return None
        if not torch_cuda:
            raise BuildError("USE_CUDA is on but the installed torch is a CPU build")
        toolkit = find_toolkit(torch_cuda)
        if toolkit is None:
            raise BuildError(
                "USE_CUDA is on but nvcc is not on PATH (install the CUDA toolkit, or "
                f'`pip install "cuda-toolkit[nvcc,cudart,cccl,crt,nvvm]=={torch_cuda}.*"`)'
            )
        return toolkit
    if not torch_cuda:
        return None
    try:
        return find_toolkit(torch_cuda)
    except BuildError as e:
        # Not asked for: a CPU build then, but say why.
        log(f"building without CUDA: {e}")
        return None


def check_prerequisites():
    """Fail early, naming the missing tool, instead of deep inside cmake."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        raise BuildError(
            "no C++ compiler found (need g++ >= 9 or clang++ with C++17); "
            "on Debian/Ubuntu: apt-get install g++"
        )
    cmake = shutil.which("cmake")
    if not cmake:
        raise BuildError(
            "cmake not found (need >= 3.12); on Debian/Ubuntu: apt-get install cmake, "
            "or `pip install cmake` into this venv"
        )
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"(\d+)\.(\d+)", out)
    version = tuple(int(x) for x in match.groups()) if match else (0, 0)
    if version < MIN_CMAKE:
        raise BuildError(
            f"cmake {'.'.join(map(str, version))} is too old (need >= 3.12); "
            "on Debian/Ubuntu: apt-get install cmake, or `pip install cmake`"
        )


def cache_dir(torch_version, cuda, cuda_version=None):
    root = pathlib.Path(
        os.environ.get("MOOLIB_WHEEL_CACHE", pathlib.Path.home() / ".cache/moolib-examples/wheels")
    )
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    # torch's CUDA version too: PyPI's CUDA builds carry no "+cu130" in their version.
    flavour = f"cuda{cuda_version or ''}-fix{CUDA_FIX_REVISION}" if cuda else "cpu"
    cxx20 = f"_cxx20fix{CXX20_FIX_REVISION}" if needs_cxx20(torch_version) else ""
    key = (
        f"moolib-{MOOLIB_VERSION}_{py}_torch-{torch_version.replace('+', '-')}_"
        f"{flavour}_fix{FIX_REVISION}{cxx20}_{sysconfig.get_platform()}"
    )
    return root / key


def patch_file(path, old, new, why):
    text = path.read_text()
    if old not in text:
        raise BuildError(f"cannot apply fix ({why}): expected text not found in {path.name}")
    path.write_text(text.replace(old, new, 1))
    log(f"patched {path.name}: {why}")


def apply_fixes(src, cuda=False, cxx20=False, cuda_torch=False):
    # Fix 1 (cmake >= 4): the bundled libuv declares cmake_minimum_required < 3.5, which cmake 4
    # refuses. Nothing to edit: the build environment sets CMAKE_POLICY_VERSION_MINIMUM=3.5,
    # which cmake 4 honours and older cmake ignores.

    # Fix 2 (Python 3.11): the bundled pybind11 2.9 touches PyFrameObject internals that
    # Python 3.11 made opaque. Use pybind11 >= 2.12 from this interpreter instead, and have its
    # FindPython pick this interpreter (otherwise it may find another Python on the machine).
    patch_file(
        src / "CMakeLists.txt",
        "add_subdirectory(third_party/pybind11)",
        "set(PYBIND11_FINDPYTHON ON)\n"
        'set(Python_EXECUTABLE "$ENV{MOOLIB_BUILD_PYTHON}")\n'
        'find_package(pybind11 2.12 CONFIG REQUIRED HINTS "$ENV{MOOLIB_PYBIND11_DIR}")',
        "use pybind11 >= 2.12 from the build interpreter",
    )

    # Fix 3 (libstdc++ 11+): std::conditional_t evaluates both branches, so
    # RpcDeferredReturn<void> still forms `void(const void&)`, which is ill-formed.
    # A trait specialised for void only ever names the valid signature.
    patch_file(
        src / "src/rpc.h",
        "template<typename T>\nstruct RpcDeferredReturn {\n"
        "  rpc::Function<std::conditional_t<std::is_same_v<void, T>, void(), void(const T&)>> f;",
        "template<typename T>\nstruct RpcDeferredSignature {\n  using type = void(const T&);\n};\n"
        "template<>\nstruct RpcDeferredSignature<void> {\n  using type = void();\n};\n\n"
        "template<typename T>\nstruct RpcDeferredReturn {\n"
        "  rpc::Function<typename RpcDeferredSignature<T>::type> f;",
        "void-safe signature for RpcDeferredReturn",
    )

    idle_polling_backs_off(src)
    relative_runpath(src)
    broker_ends_on_signals(src)
    release_build(src)
    unreachable_network_is_an_error_not_an_abort(src)
    # Only where needed, so that every other build compiles exactly as before (the CUDA builds
    # were checked without fixes 13 and 14: make cuda-build-check).
    if not cuda:
        no_cma_channel(src)
        tensorpipe_unity_build(src)
    if cxx20:
        cxx20_fixes(src)
    if cuda:
        cuda_fixes(src)
    if cuda_torch:
        cuda_torch_fixes(src)


def idle_polling_backs_off(src):
    # Fix 4 (CPU use, not the build): tensorpipe's shared-memory reactor busy-polls forever, so
    # every moolib process, an idle broker included, keeps a core at up to 100%. On a small
    # machine that starves the environments and the learner. Keep spinning while there is
    # traffic, but once the loop has been idle for a while, sleep briefly between polls, and
    # after about a second idle, longer: a broker's shared-memory loop, which no peer uses
    # (the V-trace peers talk TCP only), still took 8% of a core sleeping 200 us at a time.
    busy_loop = src / "src/tensorpipe/tensorpipe/common/busy_polling_loop.h"
    old_loop = [
        "      if (pollOnce()) {",
        "        // continue",
        "      } else if (deferredFunctionCount_ > 0) {",
        "        deferredFunctionCount_ -= runDeferredFunctionsFromEventLoop();",
        "      } else {",
        "        std::this_thread::yield();",
        "      }",
    ]
    new_loop = [
        "      if (pollOnce()) {",
        "        idlePolls_ = 0;",
        "      } else if (deferredFunctionCount_ > 0) {",
        "        deferredFunctionCount_ -= runDeferredFunctionsFromEventLoop();",
        "        idlePolls_ = 0;",
        "      } else if (++idlePolls_ < 2000) {",
        "        std::this_thread::yield();",
        "      } else if (idlePolls_ < 6000) {",
        "        std::this_thread::sleep_for(std::chrono::microseconds(200));",
        "      } else {",
        "        std::this_thread::sleep_for(std::chrono::milliseconds(2));",
        "      }",
    ]
    patch_file(
        busy_loop,
        "\n".join(old_loop),
        "\n".join(new_loop),
        "back off from busy polling when idle",
    )
    patch_file(
        busy_loop,
        "  std::atomic<int64_t> deferredFunctionCount_{0};\n",
        "  std::atomic<int64_t> deferredFunctionCount_{0};\n\n  int64_t idlePolls_{0};\n",
        "idle poll counter",
    )
    patch_file(busy_loop, "#include <thread>", "#include <chrono>\n#include <thread>", "chrono")


def relative_runpath(src):
    # Fix 5 (installs that reuse a cached wheel): cmake records the absolute path of the torch
    # it linked against as the extension's RUNPATH, so a wheel built in one checkout's venv
    # loads libtorch from that venv in every other one, and fails to import once it is gone.
    # Look for libtorch beside the extension instead: site-packages/moolib/../torch/lib.
    patch_file(
        src / "CMakeLists.txt",
        "set(CMAKE_POSITION_INDEPENDENT_CODE ON)\n",
        "set(CMAKE_POSITION_INDEPENDENT_CODE ON)\n"
        "set(CMAKE_BUILD_WITH_INSTALL_RPATH ON)\n"
        'set(CMAKE_INSTALL_RPATH "\\$ORIGIN/../torch/lib")\n',
        "RUNPATH relative to the extension: the torch of the venv it is installed in",
    )


def broker_ends_on_signals(src):
    # Fix 6 (run time): `python -m moolib.broker` stopped on SIGINT by letting KeyboardInterrupt
    # end its loop and the interpreter tear its Rpc down, and on SIGTERM by dying of the signal
    # (status -15). In 2 of about 50 rounds of a SIGINT to a broker and its peers at once it
    # stayed up after the peers had gone. The broker has nothing to save: on either signal it
    # says so, flushes its output and leaves with status 0 without the teardown.
    patch_file(
        src / "py/moolib/broker.py",
        '    print("Broker listening at %s" % FLAGS.address)\n'
        "\n"
        "    try:\n"
        "        while True:\n"
        "            broker.update()\n"
        "            time.sleep(0.25)\n"
        "    except KeyboardInterrupt:\n"
        "        pass\n",
        "    import os, signal, sys\n"
        "\n"
        "    received = []\n"
        "    for sig in (signal.SIGINT, signal.SIGTERM):\n"
        "        signal.signal(sig, lambda signum, _: received.append(signum))\n"
        "    # Only now: whoever waits for this line may signal the broker at once.\n"
        '    print("Broker listening at %s" % FLAGS.address, flush=True)\n'
        "    while not received:\n"
        "        broker.update()\n"
        "        time.sleep(0.25)\n"
        '    print(f"Broker stopped ({signal.Signals(received[0]).name})", flush=True)\n'
        "    sys.stderr.flush()\n"
        "    os._exit(0)\n",
        "the broker ends with status 0 on SIGINT and SIGTERM, every time",
    )


def release_build(src):
    # Fix 7 (install time): moolib's setup.py builds RelWithDebInfo, and writing the debug
    # information of tensorpipe's and moolib's templates is a good part of the build. Release
    # builds without it (with -O3 instead of -O2; NDEBUG is set in both).
    patch_file(
        src / "setup.py",
        'build_type = "Debug" if self.debug else "RelWithDebInfo"',
        'build_type = "Debug" if self.debug else "Release"',
        "Release build: no debug information",
    )


def unreachable_network_is_an_error_not_an_abort(src):
    # Fix 8 (run time): while a peer's network is down, connecting fails at once with
    # "network is unreachable"; tensorpipe threw that from its event loop, which aborted the
    # whole process (SIGABRT) instead of failing the one connection that moolib retries later.
    # Hand the failure to the connection's callback, as for a connection that fails later.
    uv_header = src / "src/tensorpipe/tensorpipe/transport/uv/uv.h"
    patch_file(
        uv_header,
        "    auto rv = uv_tcp_connect(request->ptr(), handle, addr, uvConnectCb);\n"
        "    request.release();\n",
        "    auto rv = uv_tcp_connect(request->ptr(), handle, addr, uvConnectCb);\n"
        "    if (rv < 0) {\n"
        "      // Failed at once: libuv will not call back, so say it here.\n"
        "      request->connectCallback_(rv);\n"
        "      return rv;\n"
        "    }\n"
        "    request.release();\n",
        "a connect that fails at once reports through its callback",
    )
    patch_file(
        uv_header,
        "    auto rv = ConnectRequest::perform(ptr(), addr.addr(), std::move(fn));\n"
        "    TP_THROW_UV_IF(rv < 0, rv);\n",
        "    ConnectRequest::perform(ptr(), addr.addr(), std::move(fn));\n",
        "no abort when the network is unreachable",
    )


def no_cma_channel(src):
    # Fix 13 (install time): tensorpipe builds its cma channel (cross-process memory
    # reads with process_vm_readv) by default. moolib never registers it: the only channel
    # it registers, in every context of rpc.cc, is "basic" (xth and cuda_ipc are commented
    # out there), and tensorpipe creates no channel that is not registered. Not building it
    # saves 14 s of compile CPU time (7 s with tensorpipe_unity_build).
    patch_file(
        src / "CMakeLists.txt",
        "add_subdirectory(src/tensorpipe)\n",
        'option(TP_ENABLE_CMA "" OFF)\nadd_subdirectory(src/tensorpipe)\n',
        "no cma channel (never registered by moolib)",
    )


def tensorpipe_unity_build(src):
    # Fix 14 (install time): tensorpipe's ~50 small sources each parse and instantiate the
    # same headers again (the standard library, libnop, its common/), which made tensorpipe
    # half the build's compile time. Compile them in batches of 8 per translation unit (a
    # CMake unity build: tensorpipe's compile CPU time falls from about 200 s to 70 s, the
    # whole build's by a third; cmake < 3.16 ignores the property and builds them one by
    # one). The code is the same: no two sources of tensorpipe define the same name in an
    # anonymous namespace of the same namespace, none has a file-scope `using namespace`,
    # and the one macro a source defines (SOCK_NONBLOCK in socket.cc, for macOS) is already
    # defined by Linux's own headers. CPU builds only (as fix 13): the CUDA builds were
    # checked without these.
    patch_file(
        src / "src/tensorpipe/tensorpipe/CMakeLists.txt",
        "## Config\n",
        "set_target_properties(tensorpipe PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)\n\n\n"
        "## Config\n",
        "unity build of tensorpipe: batches of 8 sources",
    )


def cxx20_fixes(src):
    # Fix 9 (torch >= 2.14, whose headers #error below C++20): moolib's own code is compiled
    # as C++20, and so is the bundled fmt, which follows it (fmt 8 supports C++20). tensorpipe
    # keeps the C++17 it sets for itself: it includes no torch header.
    patch_file(
        src / "CMakeLists.txt",
        "set(CMAKE_CXX_STANDARD 17)\n",
        "set(CMAKE_CXX_STANDARD 20)\n",
        "moolib's own code as C++20, as torch >= 2.14 requires",
    )
    # Fix 10 (C++20): Storage's pointer to the next free block shared an anonymous union with
    # a std::atomic of it. C++20 gave std::atomic a non-trivial default constructor, which
    # deletes the union's, and so Storage's, on GCC 12 ("use of deleted function
    # Storage::Storage()"). Nothing reads the atomic member: the plain pointer alone has the
    # same size and layout.
    patch_file(
        src / "src/function.h",
        "  union {\n"
        "    Storage* next = nullptr;\n"
        "    std::atomic<Storage*> nextAtomic;\n"
        "    static_assert(std::is_standard_layout_v<decltype(nextAtomic)>);\n"
        "    static_assert(std::is_trivially_destructible_v<decltype(nextAtomic)>);\n"
        "  };\n",
        "  Storage* next = nullptr;\n",
        "Storage without the unused atomic union member",
    )


def cuda_fixes(src):
    # Fix 11 (CUDA builds): tensorpipe's cuda_ipc channel is not built. moolib never registers
    # it (its registration in rpc.cc is commented out: it deadlocked), and it is the one part
    # that needs nvml.h, which NVIDIA's pip packages and minimal toolkits do not have, and
    # cudaDeviceProp::computeMode, which CUDA 13 removed. The channels moolib could use
    # (cuda_basic, cuda_xth, cuda_gdr) are still built.
    patch_file(
        src / "CMakeLists.txt",
        '  option(TP_USE_CUDA "" ON)\n',
        '  option(TP_USE_CUDA "" ON)\n  option(TP_ENABLE_CUDA_IPC "" OFF)\n',
        "no cuda_ipc channel (unused by moolib; needs nvml.h and pre-13 CUDA)",
    )


def cuda_torch_fixes(src):
    # Fix 12 (a CUDA build of torch 2.13, with or without CUDA for moolib): torch's CUDA cmake
    # files look for Python with only its interpreter. pybind11 then takes Python as found and
    # skips its own search, which would have brought the Development part and
    # python_add_library ("Unknown CMake command python_add_library"). Find this interpreter
    # with that part first.
    patch_file(
        src / "CMakeLists.txt",
        "set(CMAKE_PREFIX_PATH ${TorchPath})\nfind_package(Torch REQUIRED)\n",
        'set(Python_EXECUTABLE "$ENV{MOOLIB_BUILD_PYTHON}")\n'
        "find_package(Python COMPONENTS Interpreter Development.Module REQUIRED)\n"
        "set(CMAKE_PREFIX_PATH ${TorchPath})\nfind_package(Torch REQUIRED)\n",
        "Python's Development part found before torch's CUDA cmake files look for Python",
    )


def link_dir_for(toolkit_root, workdir):
    """A folder of unversioned links (libcudart.so -> libcudart.so.13, ...) for the libraries
    that a toolkit from NVIDIA's pip packages ships only with their version suffix.

    cmake's find_library looks for the unversioned name: FindCUDA for libcudart.so (torch's
    cmake files turn the static runtime off), torch's for libnvrtc.so, which torch's CUDA
    wheel brings (nvidia/cu13/lib/libnvrtc.so.13) but a toolkit may not."""
    folder = workdir / "cuda-links"
    folder.mkdir(exist_ok=True)
    site = pathlib.Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    libdirs = [toolkit_root / "lib64", toolkit_root / "lib", *sorted(site.glob("*/lib"))]
    for libdir in libdirs:
        for lib in sorted(libdir.glob("lib*.so.*")) if libdir.is_dir() else []:
            name = re.match(r"(lib[^.]+)\.so\.\d+$", lib.name)
            if not name:
                continue
            unversioned = name.group(1) + ".so"
            if not (libdir / unversioned).exists() and not (folder / unversioned).exists():
                (folder / unversioned).symlink_to(lib.resolve())
    return folder


def cuda_env(toolkit, workdir):
    """What cmake needs to find this toolkit, and nothing of another one on the machine."""
    root, version = toolkit
    env = {
        # FindCUDA (tensorpipe's and torch's copy) reads CUDA_PATH; FindCUDAToolkit reads
        # CUDAToolkit_ROOT; enable_language(CUDA) reads CUDACXX.
        "CUDA_HOME": str(root),
        "CUDA_PATH": str(root),
        "CUDAToolkit_ROOT": str(root),
        "CUDACXX": str(root / "bin" / "nvcc"),
        "CMAKE_LIBRARY_PATH": os.pathsep.join(
            filter(None, [str(link_dir_for(root, workdir)), os.environ.get("CMAKE_LIBRARY_PATH")])
        ),
    }
    if not (root / "lib64").is_dir() and (root / "lib").is_dir():
        # nvcc links from its lib64/ only; NVIDIA's pip packages have lib/ (seen first in
        # cmake's check of the CUDA compiler: "cannot find -lcudart_static").
        env["CUDAFLAGS"] = " ".join(filter(None, [os.environ.get("CUDAFLAGS"), f"-L{root}/lib"]))
    log(f"CUDA {version} toolkit at {root}")
    return env


def build_wheel(workdir, cuda, cxx20=False, toolkit=None, cuda_torch=False):
    # Build requirements first: the sdist's metadata step below runs without build isolation.
    run([sys.executable, "-m", "pip", "install", "-q", PYBIND11_REQUIREMENT, "setuptools", "wheel"])
    sdist_dir = workdir / "sdist"
    run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         "--no-build-isolation", f"moolib=={MOOLIB_VERSION}", "-d", sdist_dir]
    )  # fmt: skip
    archives = list(sdist_dir.glob("moolib-*.tar.gz"))
    if not archives:
        raise BuildError(f"pip did not download the moolib {MOOLIB_VERSION} sdist")
    with tarfile.open(archives[0]) as tar:
        # The "data" filter refuses absolute paths and links out of the tree (Python >= 3.10.12).
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(workdir, **kwargs)
    src = workdir / f"moolib-{MOOLIB_VERSION}"
    apply_fixes(src, cuda=cuda, cxx20=cxx20, cuda_torch=cuda_torch)

    pybind11_dir = subprocess.run(
        [sys.executable, "-m", "pybind11", "--cmakedir"], capture_output=True, text=True, check=True
    ).stdout.strip()

    env = dict(os.environ)
    env.update(
        USE_CUDA="1" if cuda else "0",
        CMAKE_POLICY_VERSION_MINIMUM="3.5",
        # moolib's setup.py runs `cmake --build --parallel` with no job count, which make treats
        # as unlimited jobs; bound it by the cores we have.
        CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get(
            "CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count())
        ),
        MOOLIB_BUILD_PYTHON=sys.executable,
        MOOLIB_PYBIND11_DIR=pybind11_dir,
        # moolib's CMakeLists finds torch by running `python`: make that this interpreter.
        PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    if toolkit is not None:
        env.update(cuda_env(toolkit, workdir))
        env["PATH"] = f"{toolkit[0] / 'bin'}{os.pathsep}{env['PATH']}"
    wheel_dir = workdir / "wheel"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            wheel_dir,
            src,
        ],
        env=env,
    )
    wheels = list(wheel_dir.glob("moolib-*.whl"))
    if not wheels:
        raise BuildError("the build finished but produced no wheel")
    return wheels[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rebuild", action="store_true", help="ignore a cached wheel")
    args = parser.parse_args()

    torch_version, torch_cuda = torch_info()
    toolkit = want_cuda(torch_cuda)
    cuda = toolkit is not None
    if torch_cuda and not cuda:
        # A CUDA build of torch: its cmake files want a toolkit even for moolib without CUDA.
        try:
            toolkit = find_toolkit(torch_cuda)
        except BuildError:
            toolkit = None
    cxx20 = needs_cxx20(torch_version)
    target = cache_dir(torch_version, cuda, torch_cuda)
    cached = sorted(target.glob("moolib-*.whl")) if target.is_dir() else []
    if cached and not args.rebuild:
        log(f"using cached wheel {cached[0]}")
        wheel = cached[0]
    else:
        check_prerequisites()
        cuda_text = f"on, CUDA {torch_cuda}" if cuda else "off"
        log(f"building moolib {MOOLIB_VERSION} (torch {torch_version}, CUDA {cuda_text}); "
            "this takes 2 to 3 minutes on 2 cores")  # fmt: skip
        start = time.time()
        with tempfile.TemporaryDirectory(prefix="moolib-build-") as tmp:
            built = build_wheel(pathlib.Path(tmp), cuda, cxx20, toolkit, bool(torch_cuda))
            target.mkdir(parents=True, exist_ok=True)
            # Copy then rename so that an interrupted build never leaves a half-written wheel
            # in the cache.
            partial = target / (built.name + ".partial")
            shutil.copyfile(built, partial)
            wheel = target / built.name
            partial.rename(wheel)
        log(f"built {wheel.name} in {time.time() - start:.0f} s, cached in {target}")

    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", wheel])
    check = subprocess.run(
        [sys.executable, "-c", "import moolib; moolib.Rpc()"], capture_output=True, text=True
    )
    if check.returncode != 0:
        raise BuildError(f"moolib was installed but does not import:\n{check.stderr.strip()}")
    log(f"moolib {MOOLIB_VERSION} installed into {sys.prefix}")


if __name__ == "__main__":
    try:
        main()
    except BuildError as e:
        print(f"build_moolib: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("build_moolib: interrupted", file=sys.stderr)
        sys.exit(130)
