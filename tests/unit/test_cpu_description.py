"""What a results file records of its CPU: enough to tell two "AMD EPYC" VMs apart."""

from bench import cpu

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512_bf16

processor\t: 1
cpu family\t: 99
model\t\t: 99
model name\t: Another CPU
flags\t\t: fpu
"""

ZEN3 = """processor\t: 0
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx2 fma
"""


def fields_of(tmp_path, text):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return cpu.cpuinfo_fields(path)


def test_two_cpus_of_one_name_are_told_apart(tmp_path):
    zen4, zen3 = fields_of(tmp_path, ZEN4), fields_of(tmp_path, ZEN3)
    assert cpu.cpu_model(zen4) == cpu.cpu_model(zen3) == "AMD EPYC"
    assert cpu.cpu_generation(zen4) == "family 25 model 17"  # the first processor's, not the last
    assert cpu.cpu_generation(zen3) == "family 25 model 1"
    assert cpu.vector_flags(zen4) == ["avx2", "fma", "avx512f", "avx512_bf16"]
    assert cpu.vector_flags(zen3) == ["avx2", "fma"]


def test_label_of_new_and_old_records():
    record = {"cpu": "AMD EPYC", "cpu_generation": "family 25 model 1", "vector_flags": ["avx2"]}
    assert cpu.cpu_label(record) == "AMD EPYC (family 25 model 1; avx2)"
    assert cpu.cpu_label({"cpu": "AMD EPYC"}) == "AMD EPYC"  # results written before this field
    assert cpu.cpu_label({}) == "unknown CPU"


def test_unreadable_cpuinfo(tmp_path):
    fields = cpu.cpuinfo_fields(tmp_path / "missing")
    assert fields == {}
    assert cpu.cpu_generation(fields) is None
    assert cpu.vector_flags(fields) == []
    assert cpu.cpu_model(fields)  # platform's answer or "unknown", never empty


def test_this_machine_is_described():
    described = cpu.describe_cpu()
    assert set(described) == {"cpu", "cpu_generation", "vector_flags"}
    assert all(flag in cpu.VECTOR_FLAGS for flag in described["vector_flags"])
