import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO

from examples.plot import legend_labels, main, read_table, render, rolling_mean

nan = np.nan


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


def curve(path, columns=("step", "mean_episode_return"), n=50):
    """A rising curve: step 0, 100, ... in the first column, 20, 21, ... in the others."""
    rows = ["\t".join(columns)]
    rows += ["\t".join([str(i * 100)] + [str(20 + i)] * (len(columns) - 1)) for i in range(n)]
    return write(path, "\n".join(rows) + "\n")


def run_main(capsys, *argv):
    code = main([*argv, "--width", "80", "--height", "20", "--no-color"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "window, expected",
    [
        (1, [1, nan, 3, nan, nan, 8]),
        (2, [1, 1, 3, 3, nan, 8]),
        (3, [1, 1, 2, 3, 3, 8]),
        (10, [1, 1, 2, 2, 2, 4]),
    ],
)
def test_rolling_mean_skips_nan(window, expected):
    values = [1, nan, 3, nan, nan, 8]
    np.testing.assert_allclose(rolling_mean(values, window), expected)


def test_rolling_mean_all_nan_and_empty():
    assert np.isnan(rolling_mean([nan, nan], 3)).all()
    assert rolling_mean([], 5).shape == (0,)


def test_read_table_ignores_partial_last_line(tmp_path):
    path = write(tmp_path / "logs.tsv", "step\tret\tnote\n0\t1.5\thi\n10\tnan\t\n20\t3")
    table = read_table(path)
    assert list(table) == ["step", "ret", "note"]
    np.testing.assert_array_equal(table["step"], [0, 10])
    np.testing.assert_array_equal(table["ret"], [1.5, nan])
    assert np.isnan(table["note"]).all()


def test_read_table_skips_rows_with_wrong_field_count(tmp_path, capsys):
    path = write(tmp_path / "logs.tsv", "step\tret\n0\t1\n10\t2\n20\n")
    np.testing.assert_array_equal(read_table(path)["ret"], [1, 2])
    assert "skipped 1 rows" in capsys.readouterr().err


def test_read_table_csv(tmp_path):
    for name in ("logs.csv", "logs.txt"):  # by extension, and by sniffing the header
        table = read_table(write(tmp_path / name, 'step,ret,name\n0,1,"a,b"\n5,2,c\n'))
        np.testing.assert_array_equal(table["step"], [0, 5])
        np.testing.assert_array_equal(table["ret"], [1, 2])


def test_render_has_title_labels_and_legend():
    x = np.arange(100.0)
    series = {"runs/a.tsv": (x, x**0.5), "runs/b.tsv": (x, np.full(100, nan))}
    text = render(series, "step", "mean_episode_return", 80, 20, color=False)
    assert "mean_episode_return" in text
    assert "step" in text
    assert "runs/a.tsv" in text
    assert "\x1b[" not in text
    assert "\x1b[" in render(series, "step", "ret", 80, 20, color=True)

    # plotext keeps one global figure: a second plot must not show the first one's series.
    text = render({"c.tsv": (x, x)}, "step", "loss", 60, 15, color=False)
    assert "c.tsv" in text and "a.tsv" not in text and "mean_episode_return" not in text


def test_main_plots(tmp_path, capsys):
    code, out, err = run_main(capsys, curve(tmp_path / "logs.tsv"), "--window", "5")
    assert code == 0, err
    assert "mean_episode_return" in out and "logs.tsv" in out
    assert err == ""


def test_main_glob_and_different_columns(tmp_path, capsys):
    curve(tmp_path / "a.tsv")
    curve(tmp_path / "b.tsv", ("step", "loss", "mean_episode_return"))
    curve(tmp_path / "c.tsv", ("step", "loss"))
    code, out, err = run_main(capsys, str(tmp_path / "*.tsv"))
    assert code == 0
    assert "a.tsv" in out and "b.tsv" in out and "c.tsv" not in out
    assert "c.tsv" in err and "skipped" in err


def test_main_all_nan_column(tmp_path, capsys):
    nans = write(tmp_path / "nans.tsv", "step\tmean_episode_return\n0\tnan\n1\t\n")
    code, out, err = run_main(capsys, nans, curve(tmp_path / "good.tsv"))
    assert code == 0
    assert "good.tsv" in out and "nans.tsv" not in out
    assert "nans.tsv" in err

    code, out, err = run_main(capsys, nans)
    assert code == 1
    assert out == ""
    assert "nothing to plot" in err and "Traceback" not in err


def test_main_wrong_key_lists_keys(tmp_path, capsys):
    code, out, err = run_main(capsys, curve(tmp_path / "logs.tsv"), "--ykey", "bogus")
    assert code == 2
    assert err.count("\n") == 1
    assert "bogus" in err and "step" in err and "mean_episode_return" in err


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("missing.tsv", None, "no such file"),
        ("empty.tsv", b"", "empty"),
        ("binary.tsv", bytes(range(256)), "not a text table"),
        ("numbers.tsv", b"1\t2\n3\t4\n", "not a table"),
        ("prose.tsv", b"just some words\nand more\n", "not a table"),
    ],
)
def test_main_bad_files(tmp_path, capsys, name, content, message):
    if content is not None:
        (tmp_path / name).write_bytes(content)
    code, out, err = run_main(capsys, str(tmp_path / name))
    assert code == 2
    assert name in err and message in err
    assert err.count("\n") == 1


def test_main_glob_matching_nothing(tmp_path, capsys):
    code, out, err = run_main(capsys, str(tmp_path / "nope*.tsv"))
    assert code == 2
    assert "nope*.tsv" in err


def test_main_writes_png(tmp_path, capsys):
    png = tmp_path / "curve.png"
    code, out, err = run_main(
        capsys, curve(tmp_path / "logs.tsv"), "--output", str(png), "--no-terminal"
    )
    assert code == 0, err
    assert out == ""
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert png.stat().st_size > 1000


def test_script_missing_file_no_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "plot.py"), str(tmp_path / "missing.tsv")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "missing.tsv" in result.stderr
    assert "Traceback" not in result.stderr


def test_legend_shows_what_tells_the_files_apart(tmp_path):
    peers = [curve(tmp_path / "save" / "peers" / f"peer{i}" / "logs.tsv") for i in range(2)]
    assert list(legend_labels(peers).values()) == ["peer0/logs.tsv", "peer1/logs.tsv"]
    assert legend_labels([peers[0]]) == {peers[0]: "logs.tsv"}
