"""A tab-separated log: one header line, then one flushed line per `write`.

    with TsvLog("logs.tsv") as log:
        log.write({"step": 0, "mean_episode_return": float("nan")})

Running again with the same columns appends to the same file. A file that holds something
else is never touched: the rows go to the first of logs.1.tsv, logs.2.tsv, ... that is free or
already has the same header, and `path` names the file actually written.
"""

import csv
import itertools
import math
import numbers
import sys
from pathlib import Path


def _format(value):
    # numpy scalars and one-element torch tensors: log the number, not "tensor(1.5)".
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if value is None:
        return ""
    # Bools as 1/0 so the plotter can read them as numbers.
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value).replace("\t", " ").replace("\r", " ").replace("\n", " ")


class TsvLog:
    def __init__(self, path):
        self.path = Path(path)
        self.columns = None
        self._file = None

    def _open(self, columns):
        header = "\t".join(columns) + "\n"
        wanted = self.path
        for i in itertools.count(1):
            mode = _usable(self.path, header.encode())
            if mode is not None:
                break
            self.path = wanted.with_name(f"{wanted.stem}.{i}{wanted.suffix}")
        if self.path != wanted:
            print(f"tsvlog: {wanted} has other columns, logging to {self.path}", file=sys.stderr)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # newline="" so the file gets "\n" on every platform, as the header check expects.
        self._file = open(self.path, "a", encoding="utf-8", newline="")
        # Values are formatted to text without tabs or newlines first, so nothing needs quoting.
        self._writer = csv.DictWriter(
            self._file, columns, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_NONE,
            quotechar=None, extrasaction="raise",
        )  # fmt: skip
        if mode == "new":
            self._writer.writeheader()
        elif mode == "newline":
            # An earlier run died mid-line; finish that line so our first row stands alone.
            self._file.write("\n")
        self.columns = columns

    def write(self, row: dict):
        if self._file is None:
            if not row:
                raise ValueError("the first row must name at least one column")
            for key in row:
                if not isinstance(key, str) or not key or any(c in key for c in "\t\r\n"):
                    raise ValueError(f"column names must be non-empty text without tabs: {key!r}")
            self._open(list(row))
        unknown = [key for key in row if key not in self.columns]
        if unknown:
            raise ValueError(f"columns {unknown} are not in the header of {self.path}")
        self._writer.writerow({key: _format(value) for key, value in row.items()})
        # Flush every row so `tail -f` and examples/plot.py see it while training runs.
        self._file.flush()

    def close(self):
        if self._file is not None:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def _usable(path, header):
    """How to log `header` (bytes, with its newline) to `path`, or None if it holds other data.

    "new": write the header first; "append": same header, add rows; "newline": same header but
    the last line is unfinished.
    """
    if not path.exists():
        return "new"
    if not path.is_file():
        return None
    with open(path, "rb") as f:
        # Read no further than the header could go: the file may be large, or binary.
        first = f.readline(len(header))
        if not first:
            return "new"
        if first != header and first != header[:-1]:
            return None
        f.seek(-1, 2)
        return "append" if f.read(1) == b"\n" else "newline"
