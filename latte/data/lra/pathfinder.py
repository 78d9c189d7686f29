"""Pathfinder (Linsley et al. 2018; Kim et al. 2020), the LRA 32x32 setting.

An image holds two target paths ("snakes") of short dashes ("paddles"),
distractor snakes, and two round markers. The label is 1 when both markers
sit on the ends of the SAME snake, 0 when they sit on different snakes.
A model reading the 1024 pixels as a sequence has to follow a curve.

The generative process is that of the published generator (github.com/
drewlinsley/pathfinder, with the LRA Pathfinder-32 settings of
`lra_benchmarks/data/pathfinder.py`), reimplemented here on continuous
coordinates with vectorised numpy instead of raster masks and PIL:

1. Target seeds: snake A's first paddle starts at a uniform point of the
   central square [2 d, size - 2 d]^2 (d = seed_distance), in a uniform
   direction; snake B's starts at distance d from it, in a uniform direction.
2. Growth, alternating A and B, contour_length - 1 times: the next paddle
   lies on a circle around a pivot `margin` beyond the current paddle's end.
   Candidate directions are spaced one pixel of arc apart (random phase) and
   weighted by cos(min(turn * continuity, pi / 2))^2; candidates that leave
   the image (minus padding) or come closer than `min_gap` to another paddle
   are removed. No candidate left: the pair of snakes is drawn again.
3. Distractors: num_distractors snakes of distractor_length paddles, seeded
   uniformly, grown the same way; one that cannot be completed is retried,
   then dropped (the published generator allows incomplete images too).
4. Markers (discs): on the start of one target snake and on the end of the
   same snake (label 1) or of the other one (label 0), the label a fair coin.
5. Rendering: paddles are line segments of width paddle_thickness, markers
   discs, anti-aliased by supersampling; targets at target_contrast,
   distractors at distractor_contrast (the LRA values 0.75 x 2 and 2),
   markers at 1, the maximum where they overlap; the image is scaled so its
   maximum is 255 (as the published PNGs).

Where the published code works on a pixel raster (integer endpoints, masks
dilated by the margin, rejection after a few retries), this one measures
distances between segments exactly and samples among the valid directions
directly; the distributions differ in such details, not in kind.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from latte.data.lra.common import run_shards, split_stream
from latte.data.lra.files import pixel_data
from latte.data.lra.pathfinder_canvas import Canvas
from latte.data.lra.pathfinder_draw import PathfinderSpec, render_many, unit

NUM_CLASSES = 2
VOCAB_SIZE = 257  # pixel values 0-255, and 256 for a classification token
CLS_ID = 256


@dataclass
class Scene:
    """The geometry of one image: paddle i runs from start[i] to end[i]
    (pixel units, (y, x), pixel (r, c) covers [r, r+1) x [c, c+1)) in
    direction angle[i]; snake[i] is 0 or 1 for the targets, >= 2 for
    distractors; markers [2, 2] are the disc centres."""

    start: np.ndarray
    end: np.ndarray
    angle: np.ndarray
    snake: np.ndarray
    markers: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    label: int = -1


def _seed_until(canvas: Canvas, img, draw, snake):
    """Seeds for images img, redrawing (tail, theta) = draw(n) up to
    max_seed_trials times for those whose seed did not fit."""
    placed = np.zeros(len(img), dtype=bool)
    idx = np.full(len(img), -1)
    for _ in range(canvas.spec.max_seed_trials):
        todo = np.flatnonzero(~placed)
        if not len(todo):
            break
        tail, theta = draw(len(todo))
        ok, new = canvas.seed(img[todo], tail, theta, snake)
        placed[todo[ok]], idx[todo[ok]] = True, new[ok]
    return placed, idx


def _grow_snakes(canvas: Canvas, img, ends, alive, steps: int):
    """`steps` growth rounds of the snakes whose last paddles are ends [b, S]
    (round robin over S); alive [b] turns False at a dead end."""
    for _ in range(steps):
        for k in range(ends.shape[1]):
            rows = np.flatnonzero(alive)
            if not len(rows):
                return
            ok, new = canvas.grow(img[rows], ends[rows, k])
            ends[rows[ok], k] = new[ok]
            alive[rows[~ok]] = False


def _targets(canvas: Canvas):
    """Two target snakes per image (step 1-2); (first paddles, last paddles) [B, 2]."""
    s, rng, B = canvas.spec, canvas.rng, canvas.B
    d = s.seed_distance
    lo, hi = (2 * d, s.image_size - 2 * d) if 4 * d < s.image_size else (s.image_size / 2,) * 2
    firsts, lasts = np.zeros((B, 2), dtype=np.int64), np.zeros((B, 2), dtype=np.int64)
    todo = np.arange(B)
    for _ in range(s.max_target_trials):
        canvas.truncate(todo, np.zeros(len(todo), dtype=np.int64))
        draw = lambda n: (rng.uniform(lo, hi, (n, 2)), rng.uniform(-math.pi, math.pi, n))  # noqa: E731
        ok_a, a = _seed_until(canvas, todo, draw, 0)
        tail_b = canvas.start[todo, np.maximum(a, 0)] + d * unit(rng.uniform(0, 2 * math.pi, len(todo)))
        ok_b, b = canvas.seed(todo, tail_b, rng.uniform(-math.pi, math.pi, len(todo)), 1)
        alive = ok_a & ok_b
        firsts[todo] = np.stack([a, b], 1)
        ends = firsts[todo].copy()
        _grow_snakes(canvas, todo, ends, alive, s.contour_length - 1)
        lasts[todo] = ends
        todo = todo[~alive]
        if not len(todo):
            return firsts, lasts
    raise RuntimeError(
        f"Pathfinder: no two target snakes of {s.contour_length} paddles fit in "
        f"{s.max_target_trials} trials; the spec is too crowded for image_size={s.image_size}"
    )


def _distractors(canvas: Canvas) -> None:
    """Step 3: distractor snakes, retried then dropped when they do not fit."""
    s, rng = canvas.spec, canvas.rng
    for snake in range(2, 2 + s.distractor_count):
        todo = np.arange(canvas.B)
        for _ in range(s.max_distractor_trials):
            keep = canvas.n[todo].copy()
            alive, first = _seed_until(
                canvas,
                todo,
                lambda n: (rng.uniform(canvas.lo, canvas.hi, (n, 2)), rng.uniform(-math.pi, math.pi, n)),
                snake,
            )
            _grow_snakes(canvas, todo, first[:, None].copy(), alive, s.distractor_paddles - 1)
            canvas.truncate(todo[~alive], keep[~alive])
            todo = todo[~alive]
            if not len(todo):
                break


def sample_scenes(rng: np.random.Generator, spec: PathfinderSpec, count: int) -> list[Scene]:
    """The geometry of `count` labelled images (steps 1-4 of the module docstring)."""
    labels = rng.integers(2, size=count)
    canvas = Canvas(spec, rng, count)
    firsts, lasts = _targets(canvas)
    _distractors(canvas)
    origin = rng.integers(2, size=count)
    other = np.where(labels == 1, origin, 1 - origin)
    rows = np.arange(count)
    markers = np.stack([canvas.start[rows, firsts[rows, origin]], canvas.end[rows, lasts[rows, other]]], 1)
    return [
        Scene(
            canvas.start[i, :n].copy(),
            canvas.end[i, :n].copy(),
            canvas.angle[i, :n].copy(),
            canvas.snake[i, :n].copy(),
            markers[i],
            int(labels[i]),
        )
        for i, n in enumerate(canvas.n)
    ]


def generate_shard(seed: int, shard: int, count: int, spec: PathfinderSpec) -> tuple[np.ndarray, np.ndarray, float]:
    """`count` images uint8 [count, size, size] and labels [count] of one
    shard (generator seeded by (seed, shard) only), and the seconds spent."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(shard,)))
    images = np.zeros((count, spec.image_size, spec.image_size), dtype=np.uint8)
    labels = np.zeros(count, dtype=np.int64)
    for i in range(0, count, 256):  # batches of 256 images in lockstep: memory stays small
        scenes = sample_scenes(rng, spec, min(256, count - i))
        images[i : i + len(scenes)] = render_many(scenes, spec)
        labels[i : i + len(scenes)] = [sc.label for sc in scenes]
    return images, labels, time.perf_counter() - t0


def generate_pathfinder(
    sizes: dict[str, int],
    *,
    seed: int = 0,
    spec: PathfinderSpec = PathfinderSpec(),  # noqa: B008 (a frozen dataclass: immutable)
    num_workers: int = 1,
    shard_size: int = 64,
) -> tuple[dict, dict]:
    """Splits {"train", "validation", "test"} of sizes[split] images as
    sequences of pixels, and a report (images/s overall and per core)."""
    needed = sum(sizes.values())
    num_shards = -(-needed // shard_size)
    t0 = time.perf_counter()
    images, labels, busy = [], [], 0.0
    for x, y, seconds in run_shards(
        generate_shard, ((seed, i, shard_size, spec) for i in range(num_shards)), num_workers
    ):
        images.append(x)
        labels.append(y)
        busy += seconds
    wall = time.perf_counter() - t0
    x, y = np.concatenate(images)[:needed], np.concatenate(labels)[:needed]
    order = split_stream(list(range(needed)), sizes)
    splits = {name: pixel_data(x[idx], y[idx], NUM_CLASSES) for name, idx in order.items()}
    report = {
        "generate_s": round(wall, 2),
        "images_per_s": round(needed / wall, 1),
        "images_per_s_per_core": round(num_shards * shard_size / busy, 1),
        "num_workers": num_workers,
    }
    return splits, report
