"""The benchmark's report: results.json, a plain table, and a Markdown copy for the README."""

import json

from bench.cpu import cpu_label


def plural(n, word):
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def vtrace_rows(results):
    v, env = results.get("vtrace", {}), results["env"]
    rows = []
    if "env_limit_sps" in v:
        rows.append(
            (f"V-trace {env}: env limit (EnvPool, random actions)", f"{v['env_limit_sps']:.0f} SPS")
        )
    if "learner_limit_sps" in v:
        rows.append(
            (
                f"V-trace {env}: learner limit (fwd+bwd+Adam on T*B samples, over "
                f"{v.get('learner_passes', 1)} passes), "
                f"precision={v['precision']} / as before (fp32, NCHW)",
                f"{v['learner_limit_sps']:.0f} / {v['learner_limit_before_sps']:.0f} SPS = "
                f"{v['learner_limit_sps'] / v['learner_limit_before_sps']:.2f}x",
            )
        )
        peak32, peak16 = v["peak_fp32_gflops"], v.get("peak_bf16_gflops")
        rows.append(
            (
                "V-trace learner: GFLOP per sample (fwd+bwd); GFLOP/s now / before",
                f"{v['learner_gflop_per_sample']:.3f}; {v['learner_gflops']:.0f} / "
                f"{v['learner_before_gflops']:.0f}",
            )
        )
        peaks = f"{peak32:.0f} fp32" + (f", {peak16:.0f} bf16" if peak16 else ", no bf16")
        fractions = f"{v['learner_gflops'] / peak32:.2f} of fp32"
        if peak16:
            fractions += f", {v['learner_gflops'] / peak16:.2f} of bf16"
        rows.append(
            (
                f"Machine: {MATMUL} matmul, 1 thread (GFLOP/s); learner's fraction of it",
                f"{peaks}; {fractions} (before: {v['learner_before_gflops'] / peak32:.2f} of fp32)",
            )
        )
    if "acting_sps" in v:
        rows.append(
            (
                "V-trace acting: inference samples/s (B=actor_batch_size), now / before",
                f"{v['acting_sps']:.0f} / {v['acting_before_sps']:.0f}",
            )
        )
    if "agent_sps" in v:
        rows.append(
            (f"V-trace {env}: agent, one peer (env_train_steps/s)", f"{v['agent_sps']:.0f} SPS")
        )
    if "agent_before_sps" in v:
        rows.append(
            (
                f"V-trace {env}: agent now / agent of the earlier code, same settings",
                f"{v['agent_sps']:.0f} / {v['agent_before_sps']:.0f} SPS = "
                f"{v['agent_sps'] / v['agent_before_sps']:.2f}x",
            )
        )
    if "ratio" in v:
        rows.append(("V-trace: agent / min(env limit, learner limit)", f"{v['ratio']:.2f}"))
    return rows


MATMUL = "2048x2048"


def table_rows(results):
    """(measurement, value) pairs for whatever was measured."""
    a, m, s = (results.get(k, {}) for k in ["a2c", "memory", "scaling"])
    rows = vtrace_rows(results)
    if "two_peers_vs_one" in s:
        rows.append(
            (
                "V-trace: two peers on this machine vs one (total SPS)",
                f"{s['two_peers_sps']:.0f} / {s['one_peer_sps']:.0f} = {s['two_peers_vs_one']:.2f}",
            )
        )
    if "peak_rss_mb" in m:
        rows.append(("V-trace peer: peak RSS (VmHWM)", f"{m['peak_rss_mb']:.0f} MB"))
        rows.append(
            (
                f"V-trace peer: RSS growth over {m['measured_minutes']:.1f} min after warm-up",
                f"floor {m['rss_floor_growth_mb']:+.0f} MB, median {m['rss_growth_mb']:+.0f} MB "
                f"(fit {m['rss_slope_mb_per_min']:+.1f} MB/min)",
            )
        )
    for who, prefix in [("a2c.py --no-lstm", ""), ("a2c.py LSTM", "lstm_"), ("SB3", "sb3_")]:
        key = next((k for k in a if k.startswith(f"{prefix}mean_return_")), None)
        runs = a.get(f"{prefix}runs", [])
        if key and runs:
            sps = a["sb3_a2c_sps" if prefix == "sb3_" else f"{prefix}sps"]
            rows.append(
                (
                    f"A2C CartPole, {who} (8 envs): SPS / return at "
                    f"{key.removeprefix(f'{prefix}mean_return_')}, {plural(len(runs), 'seed')}",
                    f"{sps:.0f} SPS / {a[key]:.1f}",
                )
            )
    if "sps" in a and "sb3_a2c_sps" in a:
        rows.append(
            ("A2C CartPole: a2c.py --no-lstm / SB3 SPS", f"{a['sps'] / a['sb3_a2c_sps']:.2f}")
        )
    if "defaults_runs" in a:
        returns = ", ".join(f"{r['mean_return_at_100k']:.0f}" for r in a["defaults_runs"])
        rows.append(
            (
                "A2C CartPole, a2c.py defaults (16 envs, LSTM): return at 100k per seed",
                f"{returns} ({a['defaults_seeds_over_195_at_100k']} of "
                f"{len(a['defaults_runs'])} >= 195)",
            )
        )
    return rows


def plain_table(rows):
    width = max((len(name) for name, _ in rows), default=0)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def markdown_table(results, rows):
    m = results["machine"]
    settings = " ".join(f"{k}={v}" for k, v in results["settings"].items())
    lines = [
        f"Measured {results['date'][:10]} ({results['mode']} mode) on {m['platform']}, "
        f"{cpu_label(m)}, {m['cores']} cores; torch {m['torch']}, moolib {m['moolib']}, "
        f"commit {m['git']}. "
        f"V-trace settings: `{settings}`.",
        "",
        "| measurement | value |",
        "| --- | --- |",
        *(f"| {name} | {value} |" for name, value in rows),
    ]
    return "\n".join(lines)


def save(results, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(path)


def notes(mode, parts, settings):
    text = []
    if "agent" in parts:
        minutes = mode["agent_seconds"] / 60
        text.append(
            f"memory: the agent ran {minutes:.1f} min after a {mode['agent_warmup']} s "
            "warm-up (the issue's 10-minute no-growth check is `--long`). RSS swings by a few "
            "hundred MB with every learner step; rss_floor_growth_mb, the change of the lowest "
            "RSS from the first to the second half, is the least noisy sign of a leak."
        )
    if "limits" in parts:
        text.append(
            "env and learner limits: means of one measurement before and one after the agent "
            "run, each with the machine to itself; the agent runs acting, learning and the "
            "env workers on the same cores at once. The learner limit and acting rate 'before' "
            "are today's code with the settings of earlier versions (fp32, NCHW activations), "
            "measured in alternating rounds of the same process. GFLOP per "
            "sample is torch's FlopCounterMode count of the matrix products and convolutions of "
            "one forward and backward; the peak is a 2048x2048 matmul on as many threads as the "
            "learner has (torch_threads)."
        )
    if "a2c" in parts or "sb3" in parts:
        text.append(
            "a2c: a2c.py with one batch of 8 envs in 1 EnvPool worker process (unroll 5: an "
            "optimizer step every 8 x 5 = 40 env steps), once with the MLP (--no-lstm, like "
            "SB3's MlpPolicy) and once with its default LSTM core; SB3 uses its defaults "
            "(MlpPolicy, all 8 envs in this process through DummyVecEnv, n_steps 5). SPS counts "
            "from the start of the training loop for a2c.py and of learn() for SB3; a2c.py's "
            "includes connecting to its broker. Defaults: a2c.py with no flags (2 x 8 envs, "
            "LSTM, 200k steps), the mean of the last 100 episodes ended by step 100k."
        )
    if "scaling" in parts:
        half = max(1, settings["num_actor_cpus"] // 2)
        text.append(
            f"scaling: each of the two peers has num_actor_cpus={half}; both share the same cores."
        )
    text.append("Other jobs may share this machine: compare numbers within one run.")
    return text
