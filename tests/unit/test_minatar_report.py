"""bench.minatar's report: the table, per-seed returns, JSON and picture from runs' logs."""

import json

from helpers import write_results_run as write_run

from bench import minatar


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
