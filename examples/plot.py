"""Plot a learning curve from TSV/CSV logs in the terminal, and optionally as an image.

    python examples/plot.py logs.tsv --ykey mean_episode_return --window 50
    python examples/plot.py 'outputs/*/logs.tsv' --window 50 --output curve.png
    watch -n3 --color python examples/plot.py logs.tsv --ykey mean_episode_return --window 500

One line per file, smoothed by a trailing mean over `--window` rows. The files may still be
growing: an unfinished last line is ignored. Exit status: 0 plotted, 1 nothing to plot yet
(no finite point in any file), 2 bad input (missing file, unknown column, not a table).
"""

import argparse
import csv
import glob
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import plotext


class InputError(Exception):
    """Bad input, reported as one line on stderr with exit status 2."""


def warn(message):
    print(f"plot.py: warning: {message}", file=sys.stderr)


def read_table(path) -> dict[str, np.ndarray]:
    """Columns of a TSV/CSV file with a header line, as float arrays (non-numbers are NaN)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    if not data.strip():
        raise InputError(f"{path}: empty file")
    try:
        if b"\0" in data:
            raise UnicodeError
        text = data.decode("utf-8")
    except UnicodeError:
        raise InputError(f"{path}: not a text table (binary, or not UTF-8)") from None

    # The piece after the last newline is a row still being written (or ""): leave it out.
    lines = [line.rstrip("\r") for line in text.split("\n")[:-1]]
    lines = [line for line in lines if line.strip()]
    if not lines:
        raise InputError(f"{path}: no complete header line yet")
    header = lines[0]
    if Path(path).suffix.lower() == ".csv" or ("\t" not in header and "," in header):
        rows = csv.reader(lines)
    else:
        # Tab-separated values are never quoted (see examples/common/tsvlog.py).
        rows = csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
    try:
        rows = list(rows)
    except csv.Error as e:
        raise InputError(f"{path}: not a table: {e}") from None

    names = [name.strip() for name in rows[0]]
    if len(names) < 2:
        raise InputError(f"{path}: not a table (no tab- or comma-separated header line)")
    if all(_is_number(name) for name in names):
        raise InputError(f"{path}: not a table (the first line is numbers, not column names)")
    body = [row for row in rows[1:] if len(row) == len(names)]
    if len(body) < len(rows) - 1:
        warn(f"{path}: skipped {len(rows) - 1 - len(body)} rows with the wrong number of fields")
    columns = list(zip(*body, strict=True)) if body else [()] * len(names)
    return {name: _to_float(column) for name, column in zip(names, columns, strict=True)}


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def _to_float(strings):
    try:
        return np.array(strings, dtype=float)
    except ValueError:
        # Some cells are empty or text: only those become NaN.
        return np.array([float(s) if _is_number(s) else np.nan for s in strings])


def rolling_mean(values, window) -> np.ndarray:
    """Mean of each row and the window - 1 rows before it, skipping NaN (and +-inf) rows.

    The first rows average what there is so far; a window with no finite value gives NaN.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    values = np.asarray(values, dtype=float)
    finite = np.isfinite(values)
    sums = np.cumsum(np.where(finite, values, 0.0))
    counts = np.cumsum(finite)
    sums[window:] = sums[window:] - sums[:-window]
    counts[window:] = counts[window:] - counts[:-window]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


def render(series, xkey, ykey, width, height, color=True) -> str:
    """The terminal plot of {label: (x, y)} as a string; only finite points are drawn."""
    figure = plotext.figure
    # plotext draws on one global figure: start from a blank one on every call.
    figure.clear()
    # "simple" leaves the background alone, so the plot reads on dark and light terminals.
    figure.theme("simple")
    figure.plot_size(width, height)
    drawn = []
    for label, (x, y) in series.items():
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        keep = np.isfinite(x) & np.isfinite(y)
        if keep.any():
            signal = figure.signal(x[keep].tolist(), y[keep].tolist())
            signal.lines()
            signal.label(str(label))
            figure.draw(signal)
            drawn.append((x[keep], y[keep]))
    if drawn:
        x, y, ha, va = _legend_corner(drawn)
        figure.legend(x=x, y=y, ha=ha, va=va, relative=True)
    figure.title(ykey)
    figure.label(xkey, axis="x")
    return figure.build().string(colorless=not color)


def _legend_corner(drawn):
    """Where the legend hides the fewest points: the x, y, ha, va of the emptiest corner."""
    x = np.concatenate([x for x, _ in drawn])
    y = np.concatenate([y for _, y in drawn])
    right = x > (x.min() + x.max()) / 2
    top = y > (y.min() + y.max()) / 2
    # Ties go to the first in this list: top left is where a legend is looked for first.
    corners = [(False, True), (True, False), (True, True), (False, False)]
    is_right, is_top = min(corners, key=lambda c: np.sum((right == c[0]) & (top == c[1])))
    return (
        x.max() if is_right else x.min(),
        y.max() if is_top else y.min(),
        "right" if is_right else "left",
        "top" if is_top else "bottom",
    )


def save_image(series, xkey, ykey, path):
    """The same plot as `render`, drawn by matplotlib to `path` (PNG unless it says otherwise)."""
    # Imported here: matplotlib takes longer to load than a terminal refresh should.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    for label, (x, y) in series.items():
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        keep = np.isfinite(x) & np.isfinite(y)
        ax.plot(x[keep], y[keep], label=str(label))
    ax.set_title(ykey)
    ax.set_xlabel(xkey)
    ax.grid(alpha=0.3)
    ax.legend()
    try:
        fig.savefig(path, dpi=100)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot write {path}: {e}") from None
    finally:
        plt.close(fig)


def expand(patterns):
    """File names from names and globs (quoted globs too), in order, each once."""
    paths = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(glob.glob(pattern))
            if not matches:
                raise InputError(f"no file matches {pattern}")
        else:
            matches = [pattern]
        paths += [path for path in matches if path not in paths]
    return paths


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", metavar="FILE_OR_GLOB", help="TSV or CSV logs")
    parser.add_argument("--xkey", default="step", help="column for the x axis")
    parser.add_argument("--ykey", default="mean_episode_return", help="column to plot")
    parser.add_argument("--window", type=positive_int, default=1, help="rows to average over")
    parser.add_argument("--width", type=positive_int, help="columns (default: the terminal's)")
    parser.add_argument("--height", type=positive_int, help="rows (default: the terminal's)")
    parser.add_argument("--output", help="also write the plot to this image file, e.g. curve.png")
    parser.add_argument("--no-terminal", action="store_true", help="do not print the plot")
    parser.add_argument("--no-color", action="store_true", help="print without ANSI colours")
    return parser.parse_args(argv)


def legend_labels(paths):
    """Each file's path without the folders all of them share (peer0/logs.tsv, peer1/logs.tsv
    for savedir/peers/*/logs.tsv): what tells the curves apart, short enough for a legend."""
    folders = [os.path.dirname(os.path.abspath(path)) for path in paths]
    shared = os.path.commonpath(folders) if folders else ""
    return {path: os.path.relpath(os.path.abspath(path), shared) for path in paths}


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        tables = {path: read_table(path) for path in expand(args.files)}
        available = list(dict.fromkeys(name for table in tables.values() for name in table))
        for key in (args.xkey, args.ykey):
            if all(key not in table for table in tables.values()):
                raise InputError(f"no column {key!r}; available: {', '.join(available)}")

        series = {}
        labels = legend_labels(list(tables))
        for path, table in tables.items():
            missing = [key for key in (args.xkey, args.ykey) if key not in table]
            if missing:
                warn(f"{path}: no column {missing[0]!r}, skipped")
                continue
            has_x = ~np.isnan(table[args.xkey])
            x = table[args.xkey][has_x]
            y = rolling_mean(table[args.ykey][has_x], args.window)
            keep = np.isfinite(x) & np.isfinite(y)
            if not keep.any():
                warn(f"{path}: no finite {args.ykey} yet, nothing to plot")
                continue
            series[labels[path]] = (x[keep], y[keep])
        if not series:
            print(f"plot.py: nothing to plot: no finite {args.ykey} in any file", file=sys.stderr)
            return 1

        if args.output:
            save_image(series, args.xkey, args.ykey, args.output)
    except InputError as e:
        print(f"plot.py: error: {e}", file=sys.stderr)
        return 2

    if not args.no_terminal:
        columns, lines = shutil.get_terminal_size((100, 30))
        # Capped so a huge terminal still gets a readable plot; 2 rows left for the prompt.
        width = args.width or min(columns, 200)
        height = args.height or max(min(lines - 2, 60), 10)
        text = render(series, args.xkey, args.ykey, width, height, color=not args.no_color)
        try:
            print(text, flush=True)
        except BrokenPipeError:
            # The reader left early (`| head`); point stdout at devnull so exit stays quiet.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
