"""Rows of earlier results tables kept in a new one (`--keep RESULTS_JSON`, any number of times).

A game with no finished run in this command's --workdir keeps its row from the last --keep file
that holds it, as it is there, with the command, date and machine it came from: one table of
games run at different times, each row saying where its numbers come from.

An earlier table is kept only if its runs are comparable with this command's: the same steps
and peers, and overrides that make the same experiment config as this command's do, composed
by this checkout. So a game screened with `--set key=value` stays in the table after the preset
takes that value, and a row of another setting is refused before any run starts.
"""

import json
import math
import pathlib

from omegaconf import OmegaConf


class KeepError(Exception):
    """An earlier results file that cannot be merged with this one; the message says why."""


def experiment_config(overrides):
    """The experiment's config as this checkout composes it from `overrides`, as plain data;
    None where Hydra refuses them (an override of a key that no longer exists)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from examples.vtrace.config import CONFIG_DIR  # also registers the config's schema

    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            config = compose(config_name="config", overrides=list(overrides))
    except (HydraException, ValueError):
        return None
    return OmegaConf.to_container(config, resolve=True)


def differing_keys(ours, theirs, prefix=""):
    """Dotted names of the config keys whose values differ between two composed configs."""
    keys = []
    for key in sorted(set(ours) | set(theirs), key=str):
        a, b = ours.get(key), theirs.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += differing_keys(a, b, f"{prefix}{key}.")
        elif a != b:
            keys.append(f"{prefix}{key}")
    return keys


def read_earlier(path, steps, peers, overrides):
    """The earlier NAME-results.json at `path`, checked against this command's budget and
    settings before any run starts: rows of other budgets or settings would not be comparable."""
    try:
        earlier = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as e:
        raise KeepError(f"--keep {path}: cannot read it as a results JSON ({e})") from None
    if not isinstance(earlier, dict) or not isinstance(earlier.get("games"), dict):
        raise KeepError(f"--keep {path}: not a results JSON (no steps, peers or games)")
    for key, value in [("steps", steps), ("peers", peers)]:
        if earlier.get(key) != value:
            raise KeepError(
                f"--keep {path}: its runs used {key} {earlier.get(key)}, these use {value}: "
                "the rows would not be comparable"
            )
    theirs = earlier.get("overrides")
    if theirs != overrides:
        ours_config = experiment_config(overrides)
        their_config = experiment_config(theirs) if isinstance(theirs, list) else None
        if ours_config is None or their_config is None or ours_config != their_config:
            both = ours_config is not None and their_config is not None
            differ = differing_keys(ours_config, their_config) if both else []
            which = f" (they differ in {', '.join(differ)})" if differ else ""
            raise KeepError(
                f"--keep {path}: its runs used overrides {theirs}, these use {overrides}, "
                f"which make another experiment config{which}: the rows would not be comparable"
            )
    return earlier


def with_curves_nan(row):
    """A game's row of a results JSON, the nulls of its curves NaN again (no_nan undone)."""
    seeds = {}
    for seed, summary in row["seeds"].items():
        curve = [[x, math.nan if y is None else y] for x, y in summary["curve"]]
        seeds[seed] = {**summary, "curve": curve}
    return {**row, "seeds": seeds}


def keep_earlier(result, earlier_tables, suite):
    """result (runs.build_table), with each game that has no finished run in it taken from the
    last of `earlier_tables` (read_earlier) that holds it. The published returns beside a kept
    row are the suite's own, which may list more than the earlier report did."""
    merged = {}
    for game in suite.games:
        row = result["games"].get(game)
        if row is None or not row["seeds"]:
            for earlier in reversed(earlier_tables):
                kept = earlier.get("games", {}).get(game)
                if kept and kept.get("seeds"):
                    source = {key: earlier.get(key) for key in ("command", "date", "machine",
                                                                "overrides")}  # fmt: skip
                    row = {**with_curves_nan(kept), "source": kept.get("source", source),
                           "published": suite.published[game]}  # fmt: skip
                    break
        if row is not None:
            merged[game] = row
    return {**result, "games": merged}
