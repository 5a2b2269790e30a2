"""docs/scaling.md from the results of bench/netscaling.py: what was measured, what is modelled,
and the largest group whose all-reduce costs under 10% of a step."""

import math

from bench import allreduce_model as model
from bench.cpu import cpu_label

LINK_NAMES = {
    "cpu": "no limit (CPU only)",
    "10g": "10 Gbit/s, 0.1 ms",
    "1g": "1 Gbit/s, 0.5 ms",
    "100m": "100 Mbit/s, 20 ms",
}
MODEL_BYTES = {"resnet": 1_094_115 * 4, "nature": 1_687_719 * 4, "minatar": 132_308 * 4}
MODEL_NAMES = {
    "resnet": "Atari ResNet (1.09M parameters, 4.4 MB)",
    "nature": "Nature CNN (1.69M parameters, 6.8 MB)",
    "minatar": "MinAtar net (0.13M parameters, 0.53 MB)",
}


def number(value, digits=1):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def cpu_bound(row):
    """Whether the two shared cores, not the link, set the measured time: the machine was busy
    and the reduction took much longer than the link alone would."""
    modelled = row.get("bandwidth_model_ms")
    busy = (row.get("machine_busy") or 0) > 0.9
    slow = modelled is None or row["reduce_median_ms"] > 1.5 * modelled
    return row["peers"] > 1 and busy and slow


def table(rows, model_name, learner_key):
    lines = [
        "| link | N | steps/s | reduce median / p95 (ms) | MB per step per peer, mean / max "
        "| peer CPU (cores) / machine busy | link model (ms) | + latency, modelled (ms) "
        "| real learner: group env steps/s | all-reduce share | k for < 10% |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if row["model"] != model_name:
            continue
        real = row.get(learner_key, {})
        flag = " (CPU)" if row["steps"] and cpu_bound(row) else ""
        lines.append(
            f"| {LINK_NAMES[row['link']]} | {row['peers']} | {number(row['steps_per_s'])} "
            f"| {number(row['reduce_median_ms'])} / {number(row['reduce_p95_ms'])}{flag} "
            f"| {number(row['mb_per_step_per_peer_mean'], 2)} / "
            f"{number(row['mb_per_step_per_peer_max'], 2)} "
            f"| {number(row['peer_cpu_cores'], 2)} / {number(100 * row['machine_busy'], 0)}% "
            f"| {number(row.get('bandwidth_model_ms'))} | {number(row.get('latency_term_ms'))} "
            f"| {number(real.get('env_steps_per_s'))} "
            f"| {number(100 * real['reduce_share'], 0) + '%' if real else '-'} "
            f"| {real.get('batches_per_step_for_10pct', '-')} |"
        )
    return lines


def largest_groups(rows, learner_sps):
    """The summary: per model and link, the largest group under 10%, for each learner speed, from
    the measured reduction and from the link model (both with the modelled latency)."""
    header = " | ".join(f"{s:,} SPS: measured | {s:,} SPS: link model" for s in learner_sps)
    lines = [f"| model | link | {header} |", "|---|---|" + "---:|" * 2 * len(learner_sps)]
    results = {
        (s, source): model.largest_group(rows, f"{source}{s}")
        for s in learner_sps
        for source in ("real", "model_real")
    }
    measured = max(r["peers"] for r in rows)
    for key in results[(learner_sps[0], "real")]:
        if key[1] not in LINK_NAMES or key[1] == "cpu":
            continue
        cells = []
        for s in learner_sps:
            for source in ("real", "model_real"):
                n = results[(s, source)][key]
                cells.append(f">= {n}" if n == measured else str(n))
        lines.append(f"| {key[0]} | {LINK_NAMES[key[1]]} | " + " | ".join(cells) + " |")
    return lines


def summary_table(rows):
    """Model x link rows, peer counts as columns: the measured median reduction in ms, then
    "+ the modelled latency term"; * where the two shared cores set the time."""
    counts = sorted({r["peers"] for r in rows})
    cells = {(r["model"], r["link"], r["peers"]): r for r in rows}
    lines = [
        "| model | link | " + " | ".join(f"N={n}" for n in counts) + " |",
        "|---|---|" + "---:|" * len(counts),
    ]
    for model_name, link in dict.fromkeys((r["model"], r["link"]) for r in rows):
        out = []
        for n in counts:
            row = cells.get((model_name, link, n))
            if row is None or not row["steps"]:
                out.append("-")
                continue
            text = number(row["reduce_median_ms"])
            if row.get("latency_term_ms"):
                text += f" + {number(row['latency_term_ms'])}"
            out.append(text + ("*" if cpu_bound(row) else ""))
        lines.append(f"| {model_name} | {LINK_NAMES[link]} | " + " | ".join(out) + " |")
    return lines


def markdown(results, learner_sps, batch_size, unroll_length):
    rows = results["rows"]
    machine = results.get("machine", {})
    lines = [
        "# How far a moolib group scales across hosts",
        "",
        f"Produced by `{results['command']}` on {results['date']}: {cpu_label(machine)}, "
        f"{machine.get('cores')} cores, Linux network namespaces, moolib "
        f"{machine.get('moolib')}, torch {machine.get('torch')} (commit {machine.get('git')}). "
        f"Took {results.get('minutes')} min; load average {results['load_average_start'][0]:.1f} "
        f"at the start, {results['load_average_end'][0]:.1f} at the end. "
        + ("**PARTIAL: written while the run was still going.**" if results.get("partial") else ""),
        "",
        *[line for note in results.get("notes", []) for line in (note, "")],
    ]
    lines += [
        "## Summary: the reduction of one optimizer step, in ms",
        "",
        "Measured median (stand-in learners, bandwidth emulated) + the latency term, modelled; "
        "`*`: the two shared cores, not the link, set the measured time.",
        "",
        *summary_table(rows),
        "",
    ]
    for model_name in dict.fromkeys(r["model"] for r in rows):
        key = f"real{learner_sps[0]}"
        lines += [
            f"## {MODEL_NAMES.get(model_name, model_name)}",
            "",
            *table(rows, model_name, key),
        ]
        lines.append("")
    lines += ["## Largest group whose all-reduce costs under 10% of a step", ""]
    lines += largest_groups(rows, learner_sps)
    lines.append("")
    lines += paced_section(results.get("paced_check"))
    lines += churn_section(results.get("churn"), rows)
    lines += real_check_section(results.get("real_check"))
    for part, error in results.get("errors", {}).items():
        lines.append(f"**{part} failed**: {error}")
    return "\n".join(lines) + "\n"


def churn_section(churn, rows=()):
    if not churn:
        return []
    rates = ", ".join(f"{k}: {v:.2f} steps/s" for k, v in churn["rates"].items())
    size = MODEL_BYTES.get(churn["model"], 0)
    rate_bps = {"10g": 1e10, "1g": 1e9, "100m": 1e8}.get(churn["link"])
    expected = ""
    if size and rate_bps:
        eight, seven = (1e3 * model.step_seconds(n, size, rate_bps, 0) for n in (8, 7))
        expected = (f" Expected from the link model: a reduction of {eight:.0f} ms with 8 peers "
                    f"and {seven:.0f} ms with 7.")  # fmt: skip
    table_row = [r for r in rows if (r["model"], r["link"], r["peers"]) ==
                 (churn["model"], churn["link"], 8)]  # fmt: skip
    if table_row:
        expected += f" The table's 8 peers on this link: {table_row[0]['steps_per_s']:.2f} steps/s."
    jumps = sum(len(j) for j in churn["jumps_survivors"])
    return [
        "## Peers that leave and join",
        "",
        f"{churn['peers']} stand-in peers ({churn['model']}, link {LINK_NAMES[churn['link']]}, "
        "`virtual_batch_size` = 7 batches so that 7 peers step as 8 do); one is killed "
        f"(SIGKILL), then started again; {churn['phase_s']} s per phase. Measured, each phase "
        f"from its first step: {rates}.{expected} The group stood still for "
        f"{churn['pause_after_kill_s']:.1f} s after the kill and "
        f"{churn['pause_after_restart_s']:.1f} s when the peer came back (its start took "
        f"{churn['seconds_to_rejoin']:.0f} s, imports included). No step was lost: every model "
        f"version any peer reached is in one unbroken sequence "
        f"({'yes' if churn['versions_contiguous'] else 'NO'}), no peer's version went back "
        f"({'yes' if churn['versions_never_decrease'] else 'NO'}), and all peers ended at "
        f"versions {sorted(set(churn['last_versions']))}. {jumps} time(s) a survivor's version "
        "jumped over one step: it had not received that step's result when the group changed, "
        "and took the leader's model, which holds it (moolib does that after every change). "
        f"The restarted peer's first step was model version {churn['restarted_first_version']}; "
        f"the surviving peers' step nearest in time to it: {churn['group_version_at_join']} (it "
        "took the group's state when it joined, and trained on from there).",
        "",
    ]


def real_check_section(check):
    if not check:
        return []
    lines = [
        "## Real learners against the model",
        "",
        f"Real V-trace CartPole peers (examples/vtrace/experiment.py) in namespaces, first with "
        f"no limit on the links, then at {check['rate_mbit']} Mbit/s (slow enough for the "
        "network to matter with CartPole's 19 KB of gradients). Predicted rate = 1 / (1 / rate "
        "without a limit + extra reduction time of the stand-ins at that rate). All peers and "
        "their env workers share the two cores.",
        "",
        "| N | real, no limit (steps/s) | real, limited (steps/s) | predicted (steps/s) |",
        "|---:|---:|---:|---:|",
    ]
    for g in check["groups"]:
        lines.append(
            f"| {g['peers']} | {number(g['real_unlimited_steps_per_s'], 2)} "
            f"| {number(g['real_limited_steps_per_s'], 2)} "
            f"| {number(g['predicted_steps_per_s'], 2)} |"
        )
    return [*lines, ""]


def paced_section(paced):
    if not paced:
        return []
    lines = [
        "## Stand-ins at a real learner's pace against the model",
        "",
        f"The {paced['model']} group of {paced['peers']} on {LINK_NAMES[paced['link']]} again, "
        f"with stand-ins that take {1e3 * paced['batch_s']:.0f} ms per batch (they sleep: no "
        "CPU) and add up k batches per step (`virtual_batch_size` = k x N x 32). Predicted: "
        "1 / (k x batch + the reduction time measured above). Measured, not modelled: no "
        "latency is added here.",
        "",
        "| k | measured (steps/s) | predicted (steps/s) |",
        "|---:|---:|---:|",
    ]
    for run in paced["runs"]:
        lines.append(
            f"| {run['batches_per_step']} | {number(run['measured_steps_per_s'], 2)} "
            f"| {number(run['predicted_steps_per_s'], 2)} |"
        )
    return [*lines, ""]
