"""Which CPU this is, from /proc/cpuinfo: its model name, and what tells apart two CPUs sold under
one name (VMs labelled "AMD EPYC" have come with and without AVX-512 and bf16, and a MinAtar run
made half again as many env steps/s on the one as on the other)."""

import contextlib
import pathlib
import platform

# The instructions that decide how fast the learner's fp32 and bf16 arithmetic can be.
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")


def cpuinfo_fields(path="/proc/cpuinfo"):
    """The first processor's fields of /proc/cpuinfo; {} where it cannot be read."""
    fields = {}
    with contextlib.suppress(OSError):
        for line in pathlib.Path(path).read_text().splitlines():
            if not line.strip():
                if fields:
                    break
                continue
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_model(fields=None):
    fields = cpuinfo_fields() if fields is None else fields
    return fields.get("model name") or platform.processor() or "unknown"


def cpu_generation(fields=None):
    """'family F model M' (x86 CPUs), or None where /proc/cpuinfo does not say."""
    fields = cpuinfo_fields() if fields is None else fields
    if "cpu family" in fields and "model" in fields:
        return f"family {fields['cpu family']} model {fields['model']}"
    return None


def vector_flags(fields=None):
    """Which of VECTOR_FLAGS the CPU has, in that order."""
    fields = cpuinfo_fields() if fields is None else fields
    present = set(fields.get("flags", "").split())
    return [flag for flag in VECTOR_FLAGS if flag in present]


def describe_cpu():
    fields = cpuinfo_fields()
    return {
        "cpu": cpu_model(fields),
        "cpu_generation": cpu_generation(fields),
        "vector_flags": vector_flags(fields),
    }


def cpu_label(machine):
    """'AMD EPYC (family 25 model 17; avx2, fma, avx512f, avx512_bf16)' from a recorded machine
    description; older records without the generation give the model name alone."""
    label = machine.get("cpu", "unknown CPU")
    details = [machine["cpu_generation"]] if machine.get("cpu_generation") else []
    if machine.get("vector_flags"):
        details.append(", ".join(machine["vector_flags"]))
    return f"{label} ({'; '.join(details)})" if details else label
