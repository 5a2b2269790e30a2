"""The installed moolib extension finds the torch of the venv it is installed in (a RUNPATH
relative to itself), not the torch of the checkout whose venv built the cached wheel."""

import pathlib
import struct

import moolib
import pytest

DT_RPATH, DT_RUNPATH, DT_STRTAB, DT_NULL = 15, 29, 5, 0


def library_paths(path):
    """The RPATH and RUNPATH entries of an ELF64 little-endian shared object."""
    data = pathlib.Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        pytest.skip(f"{path} is not a little-endian ELF64 file")
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    segments = [struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize) for i in range(phnum)]
    loads = [s for s in segments if s[0] == 1]  # PT_LOAD: to map addresses to file offsets
    [dynamic] = [s for s in segments if s[0] == 2]  # PT_DYNAMIC

    def offset(address):
        for _, _, file_offset, vaddr, _, filesz, _, _ in loads:
            if vaddr <= address < vaddr + filesz:
                return address - vaddr + file_offset
        raise ValueError(f"address {address:#x} is in no loaded segment")

    entries, position = [], dynamic[2]
    while True:
        tag, value = struct.unpack_from("<qQ", data, position)
        if tag == DT_NULL:
            break
        entries.append((tag, value))
        position += 16
    strtab = offset(dict(entries)[DT_STRTAB])
    paths = []
    for tag, value in entries:
        if tag in (DT_RPATH, DT_RUNPATH):
            end = data.index(b"\0", strtab + value)
            paths += data[strtab + value : end].decode().split(":")
    return paths


def test_the_extension_looks_for_torch_beside_itself():
    [extension] = pathlib.Path(moolib.__file__).parent.glob("_C*.so")
    paths = library_paths(extension)
    assert paths == ["$ORIGIN/../torch/lib"], paths
    torch_lib = extension.parent / ".." / "torch" / "lib"
    assert (torch_lib / "libtorch_python.so").exists()  # this venv's torch, where it points
