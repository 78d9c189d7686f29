"""The growth of Pathfinder snakes for many images at once (see
pathfinder.py for the process): paddles, an occupancy raster, and the
seed / grow / undo steps, each one numpy pass over the images."""

from __future__ import annotations

import math

import numpy as np

from latte.data.lra.pathfinder_draw import PathfinderSpec, unit


class Canvas:
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

    def _near(self, y, x, a, b, radius):
        """[...] True where points (y, x) [b, ...] lie within radius of
        segments a-b [b, 2] (one segment per image). Components are kept
        apart: reductions over a last axis of 2 cost more than the arithmetic."""
        shape = (len(a),) + (1,) * (y.ndim - 1)
        ay, ax = a[:, 0].reshape(shape), a[:, 1].reshape(shape)
        dy, dx = (b[:, 0] - a[:, 0]).reshape(shape), (b[:, 1] - a[:, 1]).reshape(shape)
        ry, rx = y - ay, x - ax
        t = np.clip((ry * dy + rx * dx) * (1.0 / self.spec.paddle_length**2), 0.0, 1.0)
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
            idx[ok] = self.add(
                img[ok], a[rows, j], b[rows, j], np.arctan2(u[rows, j, 0], u[rows, j, 1]), self.snake[img[ok], last[ok]]
            )
        return ok, idx
