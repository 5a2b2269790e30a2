"""bench.atari's report: the table, per-seed returns, published returns, JSON and picture."""

import functools
import json

from helpers import write_results_run

from bench import atari, runs

# A row every 6 s: the 10 rows of a run take a minute.
write_run = functools.partial(write_results_run, seconds_per_row=6.0)


def test_report_only_writes_ours_beside_the_published_returns(tmp_path):
    workdir, out = tmp_path / "runs", tmp_path / "out"
    write_run(workdir, "Pong", 0, [-21.0] * 9 + [19.0])  # last 10% of 1000 steps: 19
    write_run(workdir, "Pong", 1, [-21.0] * 9 + [17.0])
    write_run(workdir, "Breakout", 0, [1.0] * 9 + [60.0])
    write_run(workdir, "Breakout", 1, [1.0] * 9 + [10.0])  # seed 1 is not in the default set
    argv = ["--steps", "1000", "--workdir", str(workdir), "--out", str(out), "--report-only"]
    assert atari.main(argv) == 0

    table = (out / "atari-results.md").read_text().splitlines()
    pong = next(line for line in table if line.startswith("| Pong | **"))
    breakout = next(line for line in table if line.startswith("| Breakout | **"))
    assert "**18.0** ± 1.4" in pong and "| 17.0 – 19.0 | 2 | 0.004M | 1.0 min |" in pong
    assert "**60.0** ± —" in breakout and "| 1 |" in breakout  # Pong x 2 seeds, Breakout x 1
    assert "| Pong | 19.0 | 17.0 |" in table
    published = [line for line in table if "CleanRL PPO" in line]
    assert len(published) == 2 and any("| 15 to 17 |" in line for line in published)
    assert any("RLlib APPO" in line and "| 18 |" in line for line in table)
    assert any("baselines ppo2" in line and "| 13 to 16 |" in line for line in table)

    result = json.loads((out / "atari-results.json").read_text())
    assert sorted(result["games"]["Pong"]["seeds"]) == ["0", "1"]
    assert sorted(result["games"]["Breakout"]["seeds"]) == ["0"]
    assert result["overrides"] == ["preset=atari_cpu"]
    assert (out / "atari-curves.png").stat().st_size > 10_000


def test_seeds_on_the_command_line_apply_to_every_game(tmp_path):
    workdir, out = tmp_path / "runs", tmp_path / "out"
    write_run(workdir, "Breakout", 0, [1.0] * 9 + [60.0])
    write_run(workdir, "Breakout", 1, [1.0] * 9 + [40.0])
    argv = ["--games", "Breakout", "--seeds", "2", "--steps", "1000"]
    assert atari.main([*argv, "--workdir", str(workdir), "--out", str(out), "--report-only"]) == 0
    result = json.loads((out / "atari-results.json").read_text())
    assert result["games"]["Breakout"]["return_mean"] == 50.0


def test_no_finished_run_gives_no_per_seed_table(tmp_path):
    out = tmp_path / "out"
    argv = ["--games", "Pong", "--steps", "1000", "--workdir", str(tmp_path / "runs")]
    assert atari.main([*argv, "--out", str(out), "--report-only"]) == 0
    table = (out / "atari-results.md").read_text()
    assert "| Pong | **—** ± — |" in table
    assert "| game |  |" not in table and "| game | seed" not in table


def test_keep_puts_an_earlier_games_row_beside_a_new_one_each_with_its_command(tmp_path):
    earlier_runs, out_earlier = tmp_path / "earlier", tmp_path / "out1"
    write_run(earlier_runs, "Pong", 0, [-21.0] * 9 + [3.0])
    write_run(earlier_runs, "Breakout", 0, [1.0] * 9 + [5.0])  # replaced by the new run
    argv = ["--games", "Pong,Breakout", "--seeds", "1", "--steps", "1000", "--report-only"]
    assert atari.main([*argv, "--workdir", str(earlier_runs), "--out", str(out_earlier)]) == 0
    earlier = out_earlier / "atari-results.json"

    new_runs, out = tmp_path / "new", tmp_path / "out2"
    write_run(new_runs, "Breakout", 0, [1.0] * 9 + [55.0])
    argv = ["--games", "Breakout", "--steps", "1000", "--report-only", "--keep", str(earlier)]
    assert atari.main([*argv, "--workdir", str(new_runs), "--out", str(out)]) == 0

    result = json.loads((out / "atari-results.json").read_text())
    assert list(result["games"]) == ["Pong", "Breakout"]
    assert result["games"]["Pong"]["return_mean"] == 3.0
    assert result["games"]["Breakout"]["return_mean"] == 55.0
    assert "--games Pong,Breakout" in result["games"]["Pong"]["source"]["command"]
    assert "--keep" in result["games"]["Breakout"]["source"]["command"]
    table = (out / "atari-results.md").read_text().splitlines()
    runs = [line for line in table if line.startswith("- ")]
    assert len(runs) == 2 and runs[0].startswith("- Pong: `python -m bench.atari --games Pong")
    assert runs[1].startswith("- Breakout: `python -m bench.atari --games Breakout")
    # A kept game's published ranges come back from the JSON as lists: still "low to high".
    assert any(line.startswith("| Pong | CleanRL PPO") and "| 15 to 17 |" in line for line in table)


def test_keep_refuses_an_earlier_table_of_another_budget_before_running(tmp_path, capsys):
    earlier_runs, out_earlier = tmp_path / "earlier", tmp_path / "out1"
    write_run(earlier_runs, "Pong", 0, [-21.0] * 9 + [3.0])
    argv = ["--games", "Pong", "--seeds", "1", "--steps", "1000", "--report-only"]
    assert atari.main([*argv, "--workdir", str(earlier_runs), "--out", str(out_earlier)]) == 0
    earlier = str(out_earlier / "atari-results.json")

    out = tmp_path / "out2"
    # Not --report-only: the check comes before any run would start.
    argv = ["--games", "Breakout", "--steps", "2000", "--keep", earlier, "--out", str(out)]
    assert atari.main([*argv, "--workdir", str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "steps 1000, these use 2000" in err[0]
    argv = ["--games", "Breakout", "--steps", "1000", "--set", "seed=3", "--keep", earlier]
    assert atari.main([*argv, "--workdir", str(tmp_path / "new"), "--out", str(out)]) == 2
    assert "overrides" in capsys.readouterr().err
    assert atari.main(["--keep", str(tmp_path / "missing.json"), "--report-only"]) == 2
    assert "cannot read it" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "new").exists()


def test_a_resumed_runs_wall_time_is_the_sum_of_its_sittings(tmp_path):
    # Stopped at 600 steps after 60 s and resumed from its checkpoint: the log's time starts
    # again from 0 in the second sitting, which takes another 40 s.
    write_run(tmp_path, "Pong", 0, [-21.0] * 10, seconds_per_row=10.0)
    log = next(tmp_path.glob("*/peers/*/logs.tsv"))
    header, *rows = log.read_text().splitlines()
    resumed = [row.split("\t") for row in rows[6:]]
    for i, fields in enumerate(resumed, start=1):
        fields[3] = str(i * 10.0)
    log.write_text("\n".join([header, *rows[:6], *("\t".join(f) for f in resumed)]) + "\n")
    summary = runs.summarize_run([log], 1000)
    assert summary["wall_s"] == 100.0 and summary["sps"] == 10.0
