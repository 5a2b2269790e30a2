"""The pure parts of the network-scaling benchmark: moolib's all-reduce trees and their timing
model, the statistics of the measured steps, the real learner's rate, the report, and refusing
to start where network namespaces cannot be made."""

import math

import pytest

from bench import allreduce_model as model
from bench import netns, netscaling, scaling_checks, scaling_report

S = 4_000_000  # bytes
R = 1e9  # bit/s


@pytest.mark.parametrize("peers", range(1, 20))
def test_both_trees_reach_every_peer_once(peers):
    up = [c for i in range(peers) for c in model.reduce_children(i, peers)]
    assert sorted(up) == list(range(1, peers))
    down, todo = [], [(0, peers)]
    while todo:
        for child, end in model.share_children(*todo.pop()):
            down.append(child)
            todo.append((child, end))
    assert sorted(down) == list(range(1, peers))


def test_hops_grow_with_the_log_of_the_group():
    assert [model.hops_on_critical_path(n) for n in (1, 2, 4, 8, 16)] == [0, 2, 4, 6, 8]


def test_two_peers_send_one_copy_each_way():
    alone = S * 8 / R
    assert model.one_round_seconds(2, S, R, 0.0) == pytest.approx(2 * alone)
    assert model.one_round_seconds(2, S, R, 0.001) == pytest.approx(2 * alone + 0.002)
    assert model.one_round_seconds(1, S, R, 0.001) == 0.0


def test_four_peers_share_the_links_of_the_inner_peers():
    # Peers 2 and 3 send to 1 together (2x), 1 to 0 (1x); 0 to 1 and 2 together (2x), 2 to 3.
    assert model.one_round_seconds(4, S, R, 0.0) == pytest.approx(6 * S * 8 / R)


def test_shared_link_finish_times():
    assert model.shared_finish_times([0, 0], 1.0) == pytest.approx([2.0, 2.0])
    assert model.shared_finish_times([0, 0.5], 1.0) == pytest.approx([1.5, 2.0])
    assert model.shared_finish_times([2, 0], 1.0) == pytest.approx([3.0, 1.0])


def test_latency_term_is_hops_times_latency_on_busy_links():
    step_s = model.step_seconds(8, S, R, 0.0)
    # Busy links (a short step): no slow-start restart, only the hops of both rounds.
    term = model.latency_seconds(8, S, R, 0.0005, step_s=0.01)
    assert term == pytest.approx(2 * 6 * 0.0005)
    assert model.latency_seconds(8, S, 1e8, 0.02, step_s=10 * step_s) > 2 * 6 * 0.02


def test_slow_start_costs_round_trips_only_when_the_link_holds_more_than_the_window():
    assert model.slow_start_seconds(S, 1e8, 0.02) > 0.04
    assert model.slow_start_seconds(10_000, 1e8, 0.02) == 0.0


def test_percentile():
    assert model.percentile([3, 1, 2, 4, 5], 0.5) == 3
    assert model.percentile(list(range(101)), 0.95) == pytest.approx(95)
    assert math.isnan(model.percentile([], 0.5))


def test_window_steps_need_every_peer_inside_the_window():
    peer_a = [[0.0, 1.0, 0], [1.0, 2.0, 1], [2.0, None, 2]]
    peer_b = [[0.5, 1.1, 0], [1.2, 2.5, 1], [2.6, 3.0, 2]]
    steps = model.window_steps([peer_a, peer_b], 0.9, 2.6)
    assert steps == [(0, 0.5, 1.1), (1, 1.2, 2.5)]  # version 2: peer a never received it
    summary = model.summarize_steps(steps, 2.0)
    assert summary["steps"] == 2 and summary["steps_per_s"] == 1.0
    assert summary["reduce_median_ms"] == pytest.approx(1e3 * (0.6 + 1.3) / 2)


def test_real_learner_rate_adds_compute_and_reduction():
    batch_s = model.learner_seconds(5000, 32, 20)
    assert batch_s == pytest.approx(0.128)
    real = model.real_learner_rate(batch_s, 0.032, peers=4, env_steps_per_batch=640)
    assert real["steps_per_s"] == pytest.approx(1 / 0.16)
    assert real["env_steps_per_s"] == pytest.approx(4 * 640 / 0.16)
    assert real["reduce_share"] == pytest.approx(0.2)
    # 0.032 s of reduction is under 10% once a step holds 3 batches (0.384 s): 0.032/0.416.
    assert model.batches_per_step_needed(0.032, batch_s) == 3
    assert model.batches_per_step_needed(0.001, batch_s) == 1


def test_largest_group_stops_at_the_first_group_over_the_limit():
    def row(peers, share):
        return {"model": "m", "link": "l", "peers": peers, "real": {"reduce_share": share}}

    rows = [row(1, 0.01), row(2, 0.05), row(4, 0.2), row(8, 0.05)]
    assert model.largest_group(rows, "real") == {("m", "l"): 2}
    assert model.largest_group([row(1, 0.5)], "real") == {("m", "l"): 0}


def test_modelled_columns_and_report():
    row = {"model": "resnet", "link": "1g", "peers": 4, "steps": 10, "steps_per_s": 5.0,
           "reduce_median_ms": 150.0, "reduce_p95_ms": 170.0, "mb_per_step_per_peer_mean": 9.0,
           "mb_per_step_per_peer_max": 13.0, "peer_cpu_cores": 0.5, "machine_busy": 0.6,
           "window_s": 2.0}  # fmt: skip
    netscaling.add_modelled(row)
    assert row["bandwidth_model_ms"] > 100
    assert row["latency_term_ms"] > 0
    assert row["reduce_with_latency_ms"] == pytest.approx(150 + row["latency_term_ms"])
    assert 0 < row["real3000"]["reduce_share"] < row["real5000"]["reduce_share"] < 1
    # The link model's reduction (~210 ms at 1 Gbit/s) is close to the measured 150 ms here.
    assert row["model_real5000"]["reduce_share"] > row["real5000"]["reduce_share"]
    results = {"command": "python -m bench.netscaling", "date": "today", "rows": [row],
               "load_average_start": [1.0], "load_average_end": [1.0], "minutes": 1,
               "notes": netscaling.NOTES}  # fmt: skip
    text = scaling_report.markdown(results, netscaling.LEARNER_SPS, 32, 20)
    assert "Modelled, not measured: latency" in text
    assert "| resnet | 1 Gbit/s, 0.5 ms | 0 | 0 | 0 | 0 |" in text


def test_churn_checks():
    versions = [(0.0, 1), (1.0, 2), (2.0, 4), (9.0, 5)]
    assert scaling_checks.version_jumps(versions) == [(2, 4)]
    assert scaling_checks.longest_pause(versions, 1.5, 10.0) == pytest.approx(7.0)
    assert scaling_checks.phase_rate(versions, 0.0, 2.0) == pytest.approx(1.5)


def test_refuses_to_start_without_namespaces_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert netns.why_unavailable() == "creating network namespaces needs root"
    assert netscaling.main(["--smoke"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "cannot run" in err


def test_bench_mode_refuses_in_one_line(monkeypatch, capsys):
    import bench.__main__ as bench_main

    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert bench_main.main(["--only", "netscaling", "--smoke"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "needs root" in err


def test_the_markdown_goes_beside_the_results():
    import pathlib

    assert netscaling.markdown_path(pathlib.Path("docs/scaling-results.json")).name == "scaling.md"
    assert netscaling.markdown_path(pathlib.Path("/tmp/x.json")).name == "x.md"


def test_summary_table_marks_cpu_bound_cells():
    rows = [
        {"model": "m", "link": "10g", "peers": 2, "steps": 5, "reduce_median_ms": 30.0,
         "latency_term_ms": 0.4, "bandwidth_model_ms": 7.0, "machine_busy": 0.99},
        {"model": "m", "link": "1g", "peers": 2, "steps": 5, "reduce_median_ms": 75.0,
         "latency_term_ms": 2.0, "bandwidth_model_ms": 70.0, "machine_busy": 0.99},
    ]  # fmt: skip
    lines = scaling_report.summary_table(rows)
    assert lines[2] == "| m | 10 Gbit/s, 0.1 ms | 30.0 + 0.4* |"
    assert lines[3] == "| m | 1 Gbit/s, 0.5 ms | 75.0 + 2.0 |"
