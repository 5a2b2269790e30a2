"""scripts/build_moolib.py names a missing prerequisite instead of failing inside cmake."""

import os
import pathlib
import stat
import subprocess
import sys

from helpers import REPO

SCRIPT = REPO / "scripts" / "build_moolib.py"


def fake_tool(folder, name, output):
    path = pathlib.Path(folder) / name
    path.write_text(f"#!/bin/sh\necho '{output}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_without_cache(tmp_path, path_dirs):
    env = dict(os.environ, PATH=os.pathsep.join(str(d) for d in path_dirs))
    env["MOOLIB_WHEEL_CACHE"] = str(tmp_path / "empty-cache")  # force the build path
    env.pop("CXX", None)
    return subprocess.run(
        [sys.executable, SCRIPT], capture_output=True, text=True, timeout=120, env=env
    )


def test_missing_compiler_is_named(tmp_path):
    result = run_without_cache(tmp_path, [tmp_path])
    assert result.returncode == 1
    assert "no C++ compiler found" in result.stderr and "apt-get install g++" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_cmake_is_named(tmp_path):
    fake_tool(tmp_path, "c++", "fake compiler")
    result = run_without_cache(tmp_path, [tmp_path])
    assert result.returncode == 1
    assert "cmake not found" in result.stderr and ">= 3.12" in result.stderr


def test_old_cmake_is_named(tmp_path):
    fake_tool(tmp_path, "c++", "fake compiler")
    fake_tool(tmp_path, "cmake", "cmake version 3.10.2")
    result = run_without_cache(tmp_path, [tmp_path])
    assert result.returncode == 1
    assert "cmake 3.10 is too old" in result.stderr


def test_cache_key_names_every_input(tmp_path, monkeypatch):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import build_moolib
    finally:
        sys.path.pop(0)
    monkeypatch.setenv("MOOLIB_WHEEL_CACHE", str(tmp_path))
    key = build_moolib.cache_dir("2.13.0+cpu", cuda=False).name
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    for part in [
        "moolib-0.0.9b0",
        py,
        "torch-2.13.0-cpu",
        "_cpu_",
        f"fix{build_moolib.FIX_REVISION}",
    ]:
        assert part in key, (part, key)
    assert build_moolib.cache_dir("2.13.0+cu126", cuda=True).name != key


def import_script():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import build_moolib
    finally:
        sys.path.pop(0)
    return build_moolib


def test_cpu_key_has_no_cuda_or_cxx20_part(tmp_path, monkeypatch):
    """The CUDA and C++20 fixes have their own revisions, outside the CPU key of torch 2.13:
    changing them keeps CPU wheels built for torch 2.13 valid."""
    build_moolib = import_script()
    monkeypatch.setenv("MOOLIB_WHEEL_CACHE", str(tmp_path))
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    key = build_moolib.cache_dir("2.13.0+cpu", cuda=False).name
    assert key == (
        f"moolib-0.0.9b0_{py}_torch-2.13.0-cpu_cpu_fix{build_moolib.FIX_REVISION}_"
        f"{build_moolib.sysconfig.get_platform()}"
    )


def test_cuda_and_cxx20_keys(tmp_path, monkeypatch):
    build_moolib = import_script()
    monkeypatch.setenv("MOOLIB_WHEEL_CACHE", str(tmp_path))
    cuda = build_moolib.cache_dir("2.14.1+cu130", cuda=True, cuda_version="13.0").name
    assert f"_cuda13.0-fix{build_moolib.CUDA_FIX_REVISION}_" in cuda
    assert f"_cxx20fix{build_moolib.CXX20_FIX_REVISION}_" in cuda
    assert "cxx20" not in build_moolib.cache_dir("2.13.0", cuda=True, cuda_version="13.0").name
    # PyPI's CUDA builds may carry no local version: torch's CUDA version tells them apart.
    assert (
        build_moolib.cache_dir("2.13.0", cuda=True, cuda_version="12.8").name
        != build_moolib.cache_dir("2.13.0", cuda=True, cuda_version="13.0").name
    )


def test_needs_cxx20():
    build_moolib = import_script()
    for version, expected in [
        ("2.13.0", False),
        ("2.13.0+cu130", False),
        ("2.9.1", False),
        ("2.14.0", True),
        ("2.14.1+cu130", True),
        ("3.0.0", True),
    ]:
        assert build_moolib.needs_cxx20(version) is expected, version


def fake_nvcc(folder, release, top):
    """An nvcc that prints a release and, like the real one with --dryrun, its TOP."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nvcc"
    path.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *--dryrun*) echo "#$ TOP={top}" >&2 ;; '
        f'*) echo "Cuda compilation tools, release {release}, V{release}.1" ;; esac\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def fake_toolkit(root):
    (root / "include").mkdir(parents=True)
    (root / "include" / "cuda_runtime.h").write_text("")
    return root


def test_toolkit_root_comes_from_nvcc_not_its_folder(tmp_path):
    """A wrapper script (as /usr/local/bin/nvcc) is not in the toolkit: nvcc's TOP is."""
    build_moolib = import_script()
    root = fake_toolkit(tmp_path / "cuda-13.0")
    wrapper = fake_nvcc(tmp_path / "bin", "13.0", root / "bin" / "..")
    assert build_moolib.nvcc_facts(wrapper) == (root.resolve(), "13.0")


def test_toolkit_of_another_cuda_major_is_refused(tmp_path, monkeypatch):
    build_moolib = import_script()
    root = fake_toolkit(tmp_path / "cuda-12.8")
    nvcc = fake_nvcc(root / "bin", "12.8", root)
    monkeypatch.setattr(build_moolib, "toolkit_candidates", lambda: [nvcc])
    try:
        build_moolib.find_toolkit("13.0")
    except build_moolib.BuildError as e:
        assert "CUDA 12.8" in str(e) and "CUDA 13.x" in str(e)
    else:
        raise AssertionError("a CUDA 12.8 toolkit was accepted for torch's CUDA 13.0")
    other = fake_toolkit(tmp_path / "cuda-13.0")
    matching = fake_nvcc(other / "bin", "13.0", other)
    monkeypatch.setattr(build_moolib, "toolkit_candidates", lambda: [nvcc, matching])
    assert build_moolib.find_toolkit("13.0") == (other.resolve(), "13.0")


def test_unversioned_links_for_pip_toolkits(tmp_path):
    build_moolib = import_script()
    lib = tmp_path / "cu13" / "lib"
    lib.mkdir(parents=True)
    for name in ["libcudart.so.13", "libnvrtc.so.13", "libnvrtc-builtins.so.13.0", "libfoo.so"]:
        (lib / name).write_text("")
    (lib / "libfoo.so.1").write_text("")
    work = tmp_path / "work"
    work.mkdir()
    links = build_moolib.link_dir_for(tmp_path / "cu13", work)
    assert (links / "libcudart.so").resolve() == (lib / "libcudart.so.13").resolve()
    assert (links / "libnvrtc.so").resolve() == (lib / "libnvrtc.so.13").resolve()
    assert not (links / "libfoo.so").exists()  # the toolkit has it already
