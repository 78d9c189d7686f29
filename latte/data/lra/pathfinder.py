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

from latte.data.lra.pathfinder_draw import render_many, unit

NUM_CLASSES = 2
VOCAB_SIZE = 257  # pixel values 0-255, and 256 for a classification token
CLS_ID = 256


@dataclass(frozen=True)
class PathfinderSpec:
    """Defaults: the LRA Pathfinder-32 "hard" setting (contour length 14)."""

    image_size: int = 32
    contour_length: int = 14  # paddles per target snake: 6 easy, 9 intermediate, 14 hard
    distractor_length: int | None = None  # None: contour_length // 3 (LRA)
    num_distractors: int | None = None  # None: 20 // distractor_length (LRA)
    paddle_length: float = 2.0
    paddle_thickness: float = 0.5
    paddle_margin: float = 1.0
    min_gap: float | None = None  # None: 1.5 x paddle_margin
    continuity: float = 1.0
    seed_distance: float = 7.0
    marker_radius: float = 1.5
    padding: float = 1.0
    target_contrast: float = 1.5
    distractor_contrast: float = 2.0
    supersample: int = 4
    max_seed_trials: int = 3
    max_distractor_trials: int = 5
    max_target_trials: int = 1000

    def __post_init__(self):
        problems = []
        if self.image_size < 8:
            problems.append(f"image_size={self.image_size}: must be >= 8")
        if self.contour_length < 1:
            problems.append(f"contour_length={self.contour_length}: must be >= 1")
        for name in ("paddle_length", "paddle_thickness", "paddle_margin", "seed_distance", "marker_radius"):
            if getattr(self, name) <= 0:
                problems.append(f"{name}={getattr(self, name)}: must be > 0")
        if self.supersample < 1:
            problems.append(f"supersample={self.supersample}: must be >= 1")
        if problems:
            raise ValueError("PathfinderSpec: " + "; ".join(problems))

    @property
    def distractor_paddles(self) -> int:
        return self.distractor_length if self.distractor_length is not None else max(1, self.contour_length // 3)

    @property
    def distractor_count(self) -> int:
        return self.num_distractors if self.num_distractors is not None else 20 // self.distractor_paddles

    @property
    def gap(self) -> float:
        return self.min_gap if self.min_gap is not None else 1.5 * self.paddle_margin


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


class _Batch:
    """B images grown in lockstep: every step places one paddle in each image
    that still needs one, with numpy operations over the images at once.

    Occupancy is a raster of `RASTER` cells per pixel: `count[i, r, c]` is
    the number of paddles of image i within min_gap of the cell's centre.
    A candidate paddle is clear when no point along it (every 1/RASTER
    pixel) falls in a cell counted by a paddle other than its snake's
    previous one, and it keeps paddle_margin from that one."""

    RASTER = 4

    def __init__(self, spec: PathfinderSpec, rng: np.random.Generator, size: int):
        self.spec, self.rng, self.B = spec, rng, size
        cap = 2 * spec.contour_length + spec.distractor_count * spec.distractor_paddles
        self.start = np.zeros((size, cap, 2))
        self.end = np.zeros((size, cap, 2))
        self.angle = np.zeros((size, cap))
        self.snake = np.full((size, cap), -1, dtype=np.int64)
        self.n = np.zeros(size, dtype=np.int64)
        R, g = self.RASTER, spec.gap
        self.patch = int(math.ceil((spec.paddle_length + 2 * g) * R)) + 2  # cells per side of a stamp
        self.pad = self.patch  # raster margin: stamps near the border need no clipping
        side = spec.image_size * R + 2 * self.pad
        self.count = np.zeros((size, side, side), dtype=np.int16)
        self.lo, self.hi = spec.padding, spec.image_size - spec.padding
        steps = int(math.ceil(spec.paddle_length * R))
        self.along = np.linspace(0.0, 1.0, steps + 1)  # sample points along a paddle

    # ------------------------------------------------------------------ geometry

    def _cells(self, pts):
        """Raster cells (rows, cols) of points [..., 2] (padded raster)."""
        cell = np.floor(pts * self.RASTER).astype(np.int64) + self.pad
        hi = self.count.shape[1] - 1
        return np.clip(cell[..., 0], 0, hi), np.clip(cell[..., 1], 0, hi)

    def _near(self, y, x, a, b, radius):
        """[...] True where points (y, x) [b, ...] lie within radius of
        segments a-b [b, 2] (one segment per image). Components are kept
        apart: reductions over a last axis of 2 cost more than the arithmetic."""
        shape = (len(a),) + (1,) * (y.ndim - 1)
        ay, ax = a[:, 0].reshape(shape), a[:, 1].reshape(shape)
        dy, dx = (b[:, 0] - a[:, 0]).reshape(shape), (b[:, 1] - a[:, 1]).reshape(shape)
        ry, rx = y - ay, x - ax
        t = np.clip((ry * dy + rx * dx) * (1.0 / self.spec.paddle_length ** 2), 0.0, 1.0)
        oy, ox = ry - t * dy, rx - t * dx
        return oy * oy + ox * ox < radius * radius

    def valid(self, img, a, b, prev):
        """[b, K]: candidates a-b [b, K, 2] of images img [b] inside the image
        and clear of other paddles; prev [b] the snake's last paddle or -1."""
        ok = ((a >= self.lo) & (a <= self.hi) & (b >= self.lo) & (b <= self.hi)).all(-1)
        py = a[..., 0, None] + self.along * (b[..., 0] - a[..., 0])[..., None]  # [b, K, J]
        px = a[..., 1, None] + self.along * (b[..., 1] - a[..., 1])[..., None]
        hi = self.count.shape[1] - 1
        rows = np.clip(np.floor(py * self.RASTER).astype(np.int64) + self.pad, 0, hi)
        cols = np.clip(np.floor(px * self.RASTER).astype(np.int64) + self.pad, 0, hi)
        hits = self.count[img[:, None, None], rows, cols]
        has = prev >= 0
        if has.any():  # the snake's own previous paddle: may be nearer than min_gap, must not touch
            p = np.where(has, prev, 0)
            pa, pb = self.start[img, p], self.end[img, p]
            cy, cx = (rows - self.pad + 0.5) / self.RASTER, (cols - self.pad + 0.5) / self.RASTER
            mine = self._near(cy, cx, pa, pb, self.spec.gap) & has[:, None, None]
            touch = self._near(py, px, pa, pb, 0.99 * self.spec.paddle_margin) & has[:, None, None]
            hits = hits - mine
            ok &= ~touch.any(-1)
        return ok & ~(hits > 0).any(-1)

    def add(self, img, a, b, theta, snake):
        """One paddle a-b [b, 2] appended to each image of img [b]."""
        k = self.n[img]
        self.start[img, k], self.end[img, k], self.angle[img, k], self.snake[img, k] = a, b, theta, snake
        self.n[img] += 1
        self._stamp(img, a, b, 1)
        return k

    def _stamp(self, img, a, b, sign: int):
        """count += sign in the cells within min_gap of paddle a-b [b, 2] of each image img [b]."""
        R, P = self.RASTER, self.patch
        origin = np.floor((np.minimum(a, b) - self.spec.gap) * R).astype(np.int64)  # [b, 2]
        rows = origin[:, 0, None, None] + np.arange(P)[:, None]  # [b, P, 1]
        cols = origin[:, 1, None, None] + np.arange(P)  # [b, 1, P]
        near = self._near((rows + 0.5) / R, (cols + 0.5) / R, a, b, self.spec.gap)  # [b, P, P]
        i, r, c = np.nonzero(near)  # one paddle per image: the cells are distinct, plain += is exact
        self.count[img[i], origin[i, 0] + r + self.pad, origin[i, 1] + c + self.pad] += sign

    def truncate(self, img, keep):
        """Remove the paddles of images img beyond their first keep[i]."""
        if len(img) and not keep.any():  # a fresh start: clear the whole raster
            self.count[img] = 0
            self.n[img] = 0
            return
        for slot in range(int(keep.min()) if len(keep) else 0, int(self.n[img].max()) if len(img) else 0):
            sel = img[(keep <= slot) & (self.n[img] > slot)]
            if len(sel):
                self._stamp(sel, self.start[sel, slot], self.end[sel, slot], -1)
        self.n[img] = keep

    # ------------------------------------------------------------------ growth

    def seed(self, img, tail, theta, snake):
        """First paddles from tail [b, 2] in directions theta [b]; returns
        (placed [b] bool, paddle index [b])."""
        head = tail + self.spec.paddle_length * unit(theta)
        ok = self.valid(img, tail[:, None], head[:, None], np.full(len(img), -1))[:, 0]
        idx = np.full(len(img), -1)
        if ok.any():
            idx[ok] = self.add(img[ok], tail[ok], head[ok], theta[ok], snake)
        return ok, idx

    def grow(self, img, last):
        """The next paddle after paddle last [b] of images img [b]; returns
        (placed [b] bool, new paddle index [b]); False at a dead end."""
        s, rng = self.spec, self.rng
        L, m = s.paddle_length, s.paddle_margin
        theta = self.angle[img, last]  # [b]
        pivot = self.end[img, last] + m * unit(theta)
        k = max(8, int(2 * math.pi * (L + m)))  # directions one pixel of arc apart, random phase
        psi = (rng.random((len(img), 1)) + np.arange(k)) * (2 * math.pi / k)  # [b, k]
        u = unit(psi)
        a, b = pivot[:, None] + m * u, pivot[:, None] + (L + m) * u  # [b, k, 2]
        turn = np.abs((psi - theta[:, None] + math.pi) % (2 * math.pi) - math.pi)
        weight = np.cos(np.minimum(turn * s.continuity, math.pi / 2)) ** 2 * self.valid(img, a, b, last)
        total = weight.sum(1)
        ok = total >= 1e-4
        pick = (np.cumsum(weight, 1) < (rng.random(len(img)) * total)[:, None]).sum(1).clip(0, k - 1)
        idx = np.full(len(img), -1)
        if ok.any():
            rows = np.flatnonzero(ok)
            j = pick[rows]
            idx[ok] = self.add(img[ok], a[rows, j], b[rows, j], np.arctan2(u[rows, j, 0], u[rows, j, 1]),
                               self.snake[img[ok], last[ok]])
        return ok, idx


def _seed_until(batch: _Batch, img, draw, snake):
    """Seeds for images img, redrawing (tail, theta) = draw(n) up to
    max_seed_trials times for those whose seed did not fit."""
    placed = np.zeros(len(img), dtype=bool)
    idx = np.full(len(img), -1)
    for _ in range(batch.spec.max_seed_trials):
        todo = np.flatnonzero(~placed)
        if not len(todo):
            break
        tail, theta = draw(len(todo))
        ok, new = batch.seed(img[todo], tail, theta, snake)
        placed[todo[ok]], idx[todo[ok]] = True, new[ok]
    return placed, idx


def _grow_snakes(batch: _Batch, img, ends, alive, steps: int):
    """`steps` growth rounds of the snakes whose last paddles are ends [b, S]
    (round robin over S); alive [b] turns False at a dead end."""
    for _ in range(steps):
        for k in range(ends.shape[1]):
            rows = np.flatnonzero(alive)
            if not len(rows):
                return
            ok, new = batch.grow(img[rows], ends[rows, k])
            ends[rows[ok], k] = new[ok]
            alive[rows[~ok]] = False


def _targets(batch: _Batch):
    """Two target snakes per image (step 1-2); (first paddles, last paddles) [B, 2]."""
    s, rng, B = batch.spec, batch.rng, batch.B
    d = s.seed_distance
    lo, hi = (2 * d, s.image_size - 2 * d) if 4 * d < s.image_size else (s.image_size / 2,) * 2
    firsts, lasts = np.zeros((B, 2), dtype=np.int64), np.zeros((B, 2), dtype=np.int64)
    todo = np.arange(B)
    for _ in range(s.max_target_trials):
        batch.truncate(todo, np.zeros(len(todo), dtype=np.int64))
        ok_a, a = _seed_until(batch, todo, lambda n: (rng.uniform(lo, hi, (n, 2)), rng.uniform(-math.pi, math.pi, n)), 0)
        tail_b = batch.start[todo, np.maximum(a, 0)] + d * unit(rng.uniform(0, 2 * math.pi, len(todo)))
        ok_b, b = batch.seed(todo, tail_b, rng.uniform(-math.pi, math.pi, len(todo)), 1)
        alive = ok_a & ok_b
        firsts[todo] = np.stack([a, b], 1)
        ends = firsts[todo].copy()
        _grow_snakes(batch, todo, ends, alive, s.contour_length - 1)
        lasts[todo] = ends
        todo = todo[~alive]
        if not len(todo):
            return firsts, lasts
    raise RuntimeError(f"Pathfinder: no two target snakes of {s.contour_length} paddles fit in "
                       f"{s.max_target_trials} trials; the spec is too crowded for image_size={s.image_size}")


def _distractors(batch: _Batch) -> None:
    """Step 3: distractor snakes, retried then dropped when they do not fit."""
    s, rng = batch.spec, batch.rng
    for snake in range(2, 2 + s.distractor_count):
        todo = np.arange(batch.B)
        for _ in range(s.max_distractor_trials):
            keep = batch.n[todo].copy()
            alive, first = _seed_until(batch, todo, lambda n: (rng.uniform(batch.lo, batch.hi, (n, 2)),
                                                               rng.uniform(-math.pi, math.pi, n)), snake)
            _grow_snakes(batch, todo, first[:, None].copy(), alive, s.distractor_paddles - 1)
            batch.truncate(todo[~alive], keep[~alive])
            todo = todo[~alive]
            if not len(todo):
                break


def sample_scenes(rng: np.random.Generator, spec: PathfinderSpec, count: int) -> list[Scene]:
    """The geometry of `count` labelled images (steps 1-4 of the module docstring)."""
    labels = rng.integers(2, size=count)
    batch = _Batch(spec, rng, count)
    firsts, lasts = _targets(batch)
    _distractors(batch)
    origin = rng.integers(2, size=count)
    other = np.where(labels == 1, origin, 1 - origin)
    rows = np.arange(count)
    markers = np.stack([batch.start[rows, firsts[rows, origin]], batch.end[rows, lasts[rows, other]]], 1)
    return [Scene(batch.start[i, :n].copy(), batch.end[i, :n].copy(), batch.angle[i, :n].copy(),
                  batch.snake[i, :n].copy(), markers[i], int(labels[i])) for i, n in enumerate(batch.n)]


def generate_shard(seed: int, shard: int, count: int, spec: PathfinderSpec) -> tuple[np.ndarray, np.ndarray, float]:
    """`count` images uint8 [count, size, size] and labels [count] of one
    shard (generator seeded by (seed, shard) only), and the seconds spent."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(shard,)))
    images = np.zeros((count, spec.image_size, spec.image_size), dtype=np.uint8)
    labels = np.zeros(count, dtype=np.int64)
    for i in range(0, count, 256):  # batches of 256 images in lockstep: memory stays small
        scenes = sample_scenes(rng, spec, min(256, count - i))
        images[i: i + len(scenes)] = render_many(scenes, spec)
        labels[i: i + len(scenes)] = [sc.label for sc in scenes]
    return images, labels, time.perf_counter() - t0


def generate_pathfinder(sizes: dict[str, int], *, seed: int = 0, spec: PathfinderSpec = PathfinderSpec(),
                        num_workers: int = 1, shard_size: int = 64) -> tuple[dict, dict]:
    """Splits {"train", "validation", "test"} of sizes[split] images as
    sequences of pixels, and a report (images/s overall and per core)."""
    from latte.data.lra.common import run_shards, split_stream
    from latte.data.lra.files import pixel_data

    needed = sum(sizes.values())
    num_shards = -(-needed // shard_size)
    t0 = time.perf_counter()
    images, labels, busy = [], [], 0.0
    for x, y, seconds in run_shards(generate_shard, ((seed, i, shard_size, spec) for i in range(num_shards)),
                                    num_workers):
        images.append(x)
        labels.append(y)
        busy += seconds
    wall = time.perf_counter() - t0
    x, y = np.concatenate(images)[:needed], np.concatenate(labels)[:needed]
    order = split_stream(list(range(needed)), sizes)
    splits = {name: pixel_data(x[idx], y[idx], NUM_CLASSES) for name, idx in order.items()}
    report = {"generate_s": round(wall, 2), "images_per_s": round(needed / wall, 1),
              "images_per_s_per_core": round(num_shards * shard_size / busy, 1), "num_workers": num_workers}
    return splits, report
