"""Pathfinder's settings (`PathfinderSpec`, used by every stage), images from
their geometry: rendering, and an independent check of the label from the
paddles alone (see pathfinder.py for the process)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


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


def unit(theta):
    """Direction vectors (dy, dx) [..., 2] of angles theta [...]."""
    return np.stack([np.sin(theta), np.cos(theta)], axis=-1)


def _point_segment(p, a, b):
    """Distance of points p [..., 2] to segments a-b [..., 2] (broadcast)."""
    ab = b - a
    t = np.clip(((p - a) * ab).sum(-1) / np.maximum((ab * ab).sum(-1), 1e-12), 0.0, 1.0)
    return np.linalg.norm(p - (a + t[..., None] * ab), axis=-1)


def _crossing(p0, p1, q0, q1):
    """[K, N] True where segment p0-p1 properly crosses q0-q1."""
    P0, P1, Q0, Q1 = p0[:, None], p1[:, None], q0[None], q1[None]

    def side(o, a, b):
        return (a[..., 0] - o[..., 0]) * (b[..., 1] - o[..., 1]) - (a[..., 1] - o[..., 1]) * (b[..., 0] - o[..., 0])

    return (side(P0, P1, Q0) * side(P0, P1, Q1) < 0) & (side(Q0, Q1, P0) * side(Q0, Q1, P1) < 0)


def segment_distances(p0, p1, q0, q1):
    """Distances [K, N] between segments p0-p1 [K, 2] and q0-q1 [N, 2] (any lengths)."""
    P0, P1, Q0, Q1 = p0[:, None], p1[:, None], q0[None], q1[None]
    d = np.minimum(
        np.minimum(_point_segment(P0, Q0, Q1), _point_segment(P1, Q0, Q1)),
        np.minimum(_point_segment(Q0, P0, P1), _point_segment(Q1, P0, P1)),
    )
    return np.where(_crossing(p0, p1, q0, q1), 0.0, d)


def render(scene, spec) -> np.ndarray:
    """uint8 [size, size]: anti-aliased paddles and markers, maximum 255."""
    return render_many([scene], spec)[0]


def render_many(scenes, spec) -> np.ndarray:
    """uint8 [n, size, size] for n scenes at once (one numpy pass over all
    their paddles and markers)."""
    size, S, n = spec.image_size, spec.supersample, len(scenes)
    start = np.concatenate([sc.start for sc in scenes])  # [M, 2] every paddle of every scene
    end = np.concatenate([sc.end for sc in scenes])
    owner = np.repeat(np.arange(n), [len(sc.start) for sc in scenes])
    contrast = np.where(np.concatenate([sc.snake for sc in scenes]) < 2, spec.target_contrast, spec.distractor_contrast)
    centres = np.concatenate([sc.markers for sc in scenes])  # [2n, 2]
    t, r = spec.paddle_thickness, spec.marker_radius
    image = np.zeros((n, size + 8, size + 8))  # a margin: patches at the border need no clipping
    shapes = (
        (
            owner,
            np.minimum(start, end) - t,
            int(math.ceil(spec.paddle_length + 2 * t)) + 2,
            contrast,
            lambda y, x: _near_segment(y, x, start, end, t / 2),
        ),
        (
            np.repeat(np.arange(n), 2),
            centres - r,
            int(math.ceil(2 * r)) + 2,
            np.ones(len(centres)),
            lambda y, x: (y - centres[:, 0, None, None]) ** 2 + (x - centres[:, 1, None, None]) ** 2 <= r * r,
        ),
    )
    for who, corner, P, scale, inside in shapes:
        rows, cols, cov = _coverage(size, S, corner, P, inside)
        np.maximum.at(image, (who[:, None, None], rows + 4, cols + 4), cov * scale[:, None, None])
    image = image[:, 4 : size + 4, 4 : size + 4]
    peak = np.maximum(image.max(axis=(1, 2), keepdims=True), 1e-12)
    return np.round(255 * image / peak).astype(np.uint8)


def _near_segment(y, x, a, b, radius):
    """[N, ...] points (y, x) within radius of segment a-b [N, 2] (one per row)."""
    shape = (len(a),) + (1,) * (y.ndim - 1)
    ay, ax = a[:, 0].reshape(shape), a[:, 1].reshape(shape)
    dy, dx = (b[:, 0] - a[:, 0]).reshape(shape), (b[:, 1] - a[:, 1]).reshape(shape)
    ry, rx = y - ay, x - ax
    t = np.clip((ry * dy + rx * dx) / np.maximum(dy * dy + dx * dx, 1e-12), 0.0, 1.0)
    oy, ox = ry - t * dy, rx - t * dx
    return oy * oy + ox * ox <= radius * radius


def _coverage(size: int, S: int, corner, P: int, inside):
    """Fraction of each pixel covered by shapes, on a P x P pixel patch per
    shape whose top-left pixel is floor(corner): (rows, cols, coverage) [N, P, P]."""
    origin = np.floor(corner).astype(np.int64)  # [N, 2]
    sub = (np.arange(P * S) + 0.5) / S  # subsample centres within the patch
    y = origin[:, 0, None, None] + sub[None, :, None]  # [N, PS, 1]
    x = origin[:, 1, None, None] + sub[None, None, :]  # [N, 1, PS]
    hit = inside(y, x).astype(np.float64)  # [N, PS, PS]
    cov = hit.reshape(len(origin), P, S, P, S).mean(axis=(2, 4))  # [N, P, P]
    rows = origin[:, 0, None, None] + np.arange(P)[None, :, None]
    cols = origin[:, 1, None, None] + np.arange(P)[None, None, :]
    rows, cols = np.broadcast_arrays(rows, cols)
    return np.clip(rows, -4, size + 3), np.clip(cols, -4, size + 3), cov


def connected_by_paddles(scene, spec, tol: float = 1e-6) -> bool:
    """Whether the two markers are the two ends of one chain of paddles,
    decided from the paddle geometry alone (not from `snake`): paddle j
    continues paddle i when the pivot beyond i's end is the pivot before j's
    start (the growth rule), and a marker belongs to the paddle with an end
    at its centre. Used to check every label independently of how it was drawn."""
    m = spec.paddle_margin
    u = unit(scene.angle)
    after, before = scene.end + m * u, scene.start - m * u
    n = len(scene.start)
    parent = list(range(n))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    links = np.argwhere(np.linalg.norm(after[:, None] - before[None], axis=-1) < tol)
    for i, j in links:
        parent[find(int(i))] = find(int(j))
    owners = []
    for c in scene.markers:
        near = np.flatnonzero(
            (np.linalg.norm(scene.start - c, axis=-1) < tol) | (np.linalg.norm(scene.end - c, axis=-1) < tol)
        )
        if len(near) != 1:
            raise ValueError(f"Pathfinder: marker at {c.tolist()} is the end of {len(near)} paddles, expected 1")
        owners.append(find(int(near[0])))
    return owners[0] == owners[1]
