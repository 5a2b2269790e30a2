"""A stand-in for OpenCV on the GPU check's machine: only what examples/common/atari.py and
gymnasium's AtariPreprocessing call, cv2.resize of uint8 frames with INTER_AREA.

The GPU machine's files arrive as one folder of at most 64 MiB, and opencv-python-headless alone
is 54 MiB of it. bench/gpu_check.sh puts this folder on PYTHONPATH only where no real cv2 is
installed. Area interpolation is computed as OpenCV computes it for uint8 images (separable
float32 weights, rows first, rounding half to even), so that the frames are the same:
tests/unit/test_cv2_standin.py compares the two on emulator screens and on random images.
"""

import functools

import numpy as np

__version__ = "0.0-standin"
INTER_AREA = 3


@functools.lru_cache(maxsize=64)
def _area_weights(src, dst):
    """Per output index: the source indices it covers and their weights (float32), each
    the covered length of the source pixel over the output pixel's length."""
    scale = src / dst
    taps = []
    for d in range(dst):
        start = d * scale
        end = start + scale
        width = min(scale, src - start)
        first = min(int(np.ceil(start)), src - 1)
        last = min(int(np.floor(end)), src - 1)
        first = min(first, last)
        entries = []
        # A partly covered pixel counts only if more than a sliver of it is covered.
        if first - start > 1e-3:
            entries.append((first - 1, (first - start) / width))
        for s in range(first, last):
            entries.append((s, 1.0 / width))
        if end - last > 1e-3:
            entries.append((last, min(end - last, 1.0, width) / width))
        taps.append(entries)
    depth = max(len(t) for t in taps)
    index = np.zeros((depth, dst), dtype=np.intp)
    weight = np.zeros((depth, dst), dtype=np.float32)
    for d, entries in enumerate(taps):
        for k, (s, w) in enumerate(entries):
            index[k, d] = s
            weight[k, d] = np.float32(w)
    return index, weight


def _resize_area(image, width, height):
    src_h, src_w = image.shape[:2]
    if width > src_w or height > src_h:
        raise NotImplementedError("the cv2 stand-in only shrinks images with INTER_AREA")
    if src_w % width == 0 and src_h % height == 0:
        # OpenCV sums whole blocks in integers then, and rounds differently.
        raise NotImplementedError("the cv2 stand-in does not shrink by whole factors")
    xi, xw = _area_weights(src_w, width)
    yi, yw = _area_weights(src_h, height)
    pixels = image.astype(np.float32)
    channels = (1,) * (image.ndim - 2)
    # Across each row first, then down the columns, as OpenCV does: each output adds its taps
    # in order, in float32 (a sum over a short, non-innermost axis adds one term after the
    # other; the padding taps weigh 0 and come last, so they change nothing).
    rows = (pixels[:, xi] * xw.reshape(xw.shape + channels)).sum(axis=1)
    out = (rows[yi] * yw.reshape(yw.shape + (1,) + channels)).sum(axis=0)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def resize(image, size, interpolation=INTER_AREA):
    if interpolation != INTER_AREA:
        raise NotImplementedError("the cv2 stand-in implements INTER_AREA only")
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise NotImplementedError("the cv2 stand-in resizes uint8 images only")
    width, height = size
    return _resize_area(image, width, height)
