"""bench.minatar's report: the table, per-seed returns, JSON and picture from runs' logs."""

import json

from helpers import write_results_run as write_run

from bench import kept, minatar


def test_report_only_writes_the_table_per_seed_returns_json_and_curves(tmp_path):
    workdir, out = tmp_path / "runs", tmp_path / "out"
    write_run(workdir, "Breakout", 0, [1.0] * 9 + [16.0])  # last 10% of 1000 steps: 16
    write_run(workdir, "Breakout", 1, [1.0] * 9 + [34.0])
    write_run(workdir, "Seaquest", 0, [1.0] * 9 + [4.0])
    write_run(workdir, "Seaquest", 1, [1.0] * 5)  # stopped half-way: left out
    argv = ["--games", "Breakout,Seaquest", "--seeds", "2", "--steps", "1000"]
    argv += ["--workdir", str(workdir), "--out", str(out), "--report-only"]
    assert minatar.main(argv) == 0

    table = (out / "minatar-results.md").read_text().splitlines()
    breakout = next(line for line in table if line.startswith("| Breakout | **"))
    seaquest = next(line for line in table if line.startswith("| Seaquest | **"))
    # AC(λ) 17.5: the mean is above it, seed 0 is not. pgx's PPO at 20M steps: 50.
    assert "**25.0** ± 12.7" in breakout and breakout.endswith("| above | **below** |")
    assert "| 17.5 | 28.0 | 50.0 | 10.0 |" in breakout
    assert "**4.0** ± —" in seaquest and seaquest.endswith("| **below** | **below** |")  # AC(λ) 15
    assert "| Breakout | 16.0 | 34.0 |" in table
    assert "| Seaquest | 4.0 | — |" in table

    result = json.loads((out / "minatar-results.json").read_text())
    assert sorted(result["games"]["Breakout"]["seeds"]) == ["0", "1"]
    assert sorted(result["games"]["Seaquest"]["seeds"]) == ["0"]
    assert (out / "minatar-curves.png").stat().st_size > 10_000


def report(workdir, out, games, *more):
    argv = ["--games", games, "--seeds", "1", "--steps", "1000", "--report-only"]
    return minatar.main([*argv, "--workdir", str(workdir), "--out", str(out), *more])


def test_keep_takes_each_game_from_the_last_table_holding_it_screened_settings_included(tmp_path):
    # Screens run with `--set` of the value the preset has now make the same experiment config as
    # the preset alone: their rows are comparable, and each keeps the command that made it.
    hidden = kept.experiment_config(["preset=minatar"])["minatar_hidden"]
    screen = ["--set", f"minatar_hidden={hidden}"]
    write_run(tmp_path / "a", "Breakout", 0, [1.0] * 9 + [30.0])
    write_run(tmp_path / "a", "Seaquest", 0, [1.0] * 9 + [50.0])
    assert report(tmp_path / "a", tmp_path / "out-a", "Breakout,Seaquest", *screen) == 0
    write_run(tmp_path / "b", "Seaquest", 0, [1.0] * 9 + [90.0])
    assert report(tmp_path / "b", tmp_path / "out-b", "Seaquest", *screen) == 0
    write_run(tmp_path / "new", "Asterix", 0, [1.0] * 9 + [40.0])
    earlier = [tmp_path / f"out-{x}" / "minatar-results.json" for x in "ab"]
    keep = ["--keep", str(earlier[0]), "--keep", str(earlier[1])]
    assert report(tmp_path / "new", tmp_path / "out", "Asterix", *keep) == 0

    result = json.loads((tmp_path / "out" / "minatar-results.json").read_text())
    assert list(result["games"]) == ["Asterix", "Breakout", "Seaquest"]
    returns = {game: row["return_mean"] for game, row in result["games"].items()}
    assert returns == {"Asterix": 40.0, "Breakout": 30.0, "Seaquest": 90.0}
    assert result["overrides"] == ["preset=minatar"]
    sources = {game: row["source"] for game, row in result["games"].items()}
    assert f"minatar_hidden={hidden}" in sources["Breakout"]["command"]
    assert sources["Seaquest"]["command"].endswith(f"--set minatar_hidden={hidden}")
    assert "--keep" in sources["Asterix"]["command"]


def test_keep_refuses_a_table_of_another_setting_naming_the_key_before_running(tmp_path, capsys):
    hidden = kept.experiment_config(["preset=minatar"])["minatar_hidden"]
    write_run(tmp_path / "a", "Breakout", 0, [1.0] * 9 + [30.0])
    wider = ["--set", f"minatar_hidden={2 * hidden}"]
    assert report(tmp_path / "a", tmp_path / "out-a", "Breakout", *wider) == 0
    capsys.readouterr()

    earlier = str(tmp_path / "out-a" / "minatar-results.json")
    argv = ["--games", "Seaquest", "--steps", "1000", "--keep", earlier]
    argv += ["--workdir", str(tmp_path / "new"), "--out", str(tmp_path / "out")]
    assert minatar.main(argv) == 2  # not --report-only: refused before any run starts
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "differ in minatar_hidden)" in err[0]
    assert not (tmp_path / "new").exists()
    argv[4:4] = ["--set", "no_such_key=1"]
    assert minatar.main(argv) == 2
    assert "another experiment config" in capsys.readouterr().err
    (tmp_path / "list.json").write_text("[1, 2]")
    argv[argv.index("--keep") + 1] = str(tmp_path / "list.json")
    assert minatar.main(argv) == 2
    assert "not a results JSON" in capsys.readouterr().err
    assert not (tmp_path / "new").exists() and not (tmp_path / "out").exists()


def test_each_run_has_the_share_of_cpu_time_its_hypervisor_took(tmp_path):
    """bench.runs records /proc/stat's CPU times when a run starts and ends; the report gives the
    steal share between them (None for runs of before, which have no record)."""
    workdir, out = tmp_path / "runs", tmp_path / "out"
    write_run(workdir, "Breakout", 0, [1.0] * 10)
    write_run(workdir, "Seaquest", 0, [1.0] * 10)
    # user nice system idle iowait irq softirq steal: 100 s of CPU time, 5 of it stolen.
    start, end = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [80, 0, 5, 10, 0, 0, 0, 5, 0, 0]
    lines = "".join(" ".join(map(str, times)) + "\n" for times in (start, end))
    (workdir / "Breakout-s0-p1-1000" / "cpu_times").write_text(lines)
    assert report(workdir, out, "Breakout,Seaquest") == 0
    games = json.loads((out / "minatar-results.json").read_text())["games"]
    assert games["Breakout"]["seeds"]["0"]["steal"] == 0.05
    assert games["Seaquest"]["seeds"]["0"]["steal"] is None
