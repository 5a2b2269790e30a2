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
