import math

import numpy as np
import pytest

from examples.common.tsvlog import TsvLog


def read(path):
    return path.read_text(encoding="utf-8")


def test_header_once_and_formatting(tmp_path):
    path = tmp_path / "logs.tsv"
    with TsvLog(path) as log:
        log.write({"step": 0, "ret": 1.5, "loss": float("nan"), "note": "a\tb\nc"})
        log.write({"step": 10, "ret": 1 / 3, "loss": np.float32(0.25), "note": True})
        log.write({"step": 20})  # missing keys become empty cells
    assert read(path) == (
        "step\tret\tloss\tnote\n0\t1.5\tnan\ta b c\n10\t0.333333\t0.25\t1\n20\t\t\t\n"
    )
    assert log.path == path


def test_unknown_key_raises(tmp_path):
    with TsvLog(tmp_path / "logs.tsv") as log:
        log.write({"step": 0})
        with pytest.raises(ValueError, match="ret"):
            log.write({"step": 1, "ret": 2.0})


def test_rows_are_flushed_while_open(tmp_path):
    path = tmp_path / "logs.tsv"
    with TsvLog(path) as log:
        log.write({"step": 0, "ret": 1.0})
        assert read(path) == "step\tret\n0\t1\n"
        log.write({"step": 1, "ret": 2.0})
        assert read(path).splitlines()[-1] == "1\t2"


def test_same_header_appends(tmp_path):
    path = tmp_path / "logs.tsv"
    with TsvLog(path) as log:
        log.write({"step": 0, "ret": 1.0})
    with TsvLog(path) as log:
        log.write({"step": 1, "ret": 2.0})
    assert log.path == path
    assert read(path) == "step\tret\n0\t1\n1\t2\n"


def test_empty_existing_file_gets_header(tmp_path):
    path = tmp_path / "logs.tsv"
    path.touch()
    with TsvLog(path) as log:
        log.write({"step": 0})
    assert log.path == path
    assert read(path) == "step\n0\n"


def test_other_header_goes_to_new_file(tmp_path, capsys):
    path = tmp_path / "logs.tsv"
    path.write_bytes(b"step\tret\n0\t1\npartial")
    before = path.read_bytes()
    with TsvLog(path) as log:
        log.write({"step": 0, "loss": 0.5})
    assert log.path == tmp_path / "logs.1.tsv"
    assert path.read_bytes() == before
    assert read(log.path) == "step\tloss\n0\t0.5\n"
    assert "logs.1.tsv" in capsys.readouterr().err

    # A third layout skips logs.1.tsv; the second layout again finds logs.1.tsv and appends.
    with TsvLog(path) as log:
        log.write({"x": 1})
    assert log.path == tmp_path / "logs.2.tsv"
    with TsvLog(path) as log:
        log.write({"step": 1, "loss": 0.25})
    assert log.path == tmp_path / "logs.1.tsv"
    assert read(log.path) == "step\tloss\n0\t0.5\n1\t0.25\n"
    assert path.read_bytes() == before


def test_binary_or_headerless_file_untouched(tmp_path):
    path = tmp_path / "logs.tsv"
    path.write_bytes(bytes(range(256)) * 10)
    with TsvLog(path) as log:
        log.write({"step": 0})
    assert log.path == tmp_path / "logs.1.tsv"
    assert path.read_bytes() == bytes(range(256)) * 10


def test_header_checked_lazily(tmp_path):
    path = tmp_path / "logs.tsv"
    log = TsvLog(path)
    assert not path.exists()
    log.close()
    assert not path.exists()


def test_partial_last_line_does_not_corrupt_next_row(tmp_path):
    path = tmp_path / "logs.tsv"
    path.write_text("step\tret\n0\t1\n1\t2.5", encoding="utf-8")  # crashed mid-row
    with TsvLog(path) as log:
        log.write({"step": 2, "ret": 3.0})
    assert log.path == path
    assert read(path) == "step\tret\n0\t1\n1\t2.5\n2\t3\n"


def test_header_without_newline_is_continued(tmp_path):
    path = tmp_path / "logs.tsv"
    path.write_text("step\tret", encoding="utf-8")
    with TsvLog(path) as log:
        log.write({"step": 0, "ret": math.inf})
    assert read(path) == "step\tret\n0\tinf\n"
