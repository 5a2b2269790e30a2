"""MinAtar results: the V-trace agent on the five MinAtar games next to published agents.

    python -m bench.minatar                      # 5 games x 5 seeds x 5M steps (hours on 2 cores)
    python -m bench.minatar --games Breakout --seeds 1 --steps 1000000   # a quick look
    python -m bench.minatar --peers 2 --games Breakout   # the same training by two peers

One `python -m examples.vtrace.experiment preset=minatar` run per game and seed (bench/runs.py
runs them and writes the report). Under --out (default docs/): minatar-results.md and .json, per
game the mean episode return over the last 10% of the steps (mean and spread over seeds), wall
time and env steps per second, beside the returns published for the MinAtar paper's AC(lambda),
gymnax's PPO and pgx's PPO, and whether the mean and every seed reach AC(lambda);
minatar-curves.png, one panel per game, one thin line per seed and their mean.
"""

import sys

from bench import runs
from bench.runs import num, per_seed_table, sources_lines

GAMES = ["Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders"]

# Mean return at 5M frames, read off the learning curves in the MinAtar repository's README
# (30 seeds, full action set, sticky actions 0.1), and gymnax's PPO checkpoints (its README).
# pgx_ppo: the end of pgx's PPO curves (sotetsuk/pgx examples/minatar-ppo/assets/*.png, its
# train.py's default 20M steps, 4,096 envs; sticky actions 0.1, minimal action set): four times
# our budget, the stronger anchor.
PUBLISHED = {
    "Asterix": {"ac_lambda": 19.0, "dqn": 17.0, "gymnax_ppo": 15.0, "pgx_ppo": 22.0},
    "Breakout": {"ac_lambda": 17.5, "dqn": 10.0, "gymnax_ppo": 28.0, "pgx_ppo": 50.0},
    "Freeway": {"ac_lambda": 47.0, "dqn": 50.0, "gymnax_ppo": 58.0, "pgx_ppo": 63.0},
    "Seaquest": {"ac_lambda": 15.0, "dqn": 20.0, "gymnax_ppo": None, "pgx_ppo": 54.0},
    "SpaceInvaders": {"ac_lambda": 185.0, "dqn": 43.0, "gymnax_ppo": 131.0, "pgx_ppo": 144.0},
}


def markdown(result):
    def against(ours, published):
        if ours is None or published is None:
            return "—"
        return "above" if ours >= published else "**below**"

    lines = [
        "| game | ours: return (mean ± std over seeds) | seeds: min – max | runs | wall time "
        "per run | env steps/s | AC(λ) | gymnax PPO | pgx PPO (20M steps) | DQN "
        "| ours vs AC(λ): mean | every seed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for game, row in result["games"].items():
        published = row["published"]
        ours = f"**{num(row['return_mean'])}** ± {num(row['return_std'])}"
        lines.append(
            f"| {game} | {ours} | {num(row['return_min'])} – {num(row['return_max'])} "
            f"| {len(row['seeds'])} | "
            f"{num(row['wall_s_mean'] and row['wall_s_mean'] / 60)} min | "
            f"{num(row['sps_mean'], 0)} | {num(published['ac_lambda'])} | "
            f"{num(published['gymnax_ppo'])} | {num(published.get('pgx_ppo'))} | "
            f"{num(published['dqn'])} | {against(row['return_mean'], published['ac_lambda'])} | "
            f"{against(row['return_min'], published['ac_lambda'])} |"
        )
    return "\n".join([*lines, "", *per_seed_table(result), "", *sources_lines(result)]) + "\n"


def reference_lines(published):
    lines = [
        ("AC(λ)", published["ac_lambda"], "--"),
        ("gymnax PPO", published["gymnax_ppo"], ":"),
        ("pgx PPO at 20M", published.get("pgx_ppo"), "-."),  # reports before it lack it
    ]
    return [line for line in lines if line[1] is not None]


SUITE = runs.Suite(
    name="minatar",
    preset="minatar",
    env_id=lambda game: f"MinAtar/{game}-v1",
    games=GAMES,
    seeds=5,
    steps=5_000_000,
    published=PUBLISHED,
    markdown=markdown,
    reference_lines=reference_lines,
    description=__doc__.split("\n")[0],
)


def main(argv=None):
    return runs.main(SUITE, argv)


if __name__ == "__main__":
    sys.exit(main())
