"""Pathfinder: labels on constructed scenes (geometry and pixels), labels and
geometry rules of generated scenes, determinism per seed."""

import math

import numpy as np
import pytest

from latte.data.lra import pathfinder as P
from latte.data.lra.pathfinder_draw import connected_by_paddles, render, segment_distances, unit

SPEC = P.PathfinderSpec()


def chain(y0, x0, angles, spec=SPEC):
    """Paddles grown by the generator's rule from a first paddle at (y0, x0):
    each next paddle starts `margin` past a pivot `margin` beyond the last end."""
    L, m = spec.paddle_length, spec.paddle_margin
    start, end = [np.array([y0, x0], float)], []
    end.append(start[0] + L * unit(angles[0]))
    for prev, theta in zip(angles, angles[1:]):
        pivot = end[-1] + m * unit(prev)
        start.append(pivot + m * unit(theta))
        end.append(pivot + (L + m) * unit(theta))
    return np.array(start), np.array(end), np.array(angles, float)


def scene_of(snakes, marker_ends, label):
    """A Scene from chains; marker_ends = ((snake, "start"|"end"), (snake, ...))."""
    start = np.concatenate([s for s, _, _ in snakes])
    end = np.concatenate([e for _, e, _ in snakes])
    angle = np.concatenate([a for _, _, a in snakes])
    snake = np.concatenate([np.full(len(s), k) for k, (s, _, _) in enumerate(snakes)])
    markers = np.array([snakes[k][0][0] if where == "start" else snakes[k][1][-1] for k, where in marker_ends])
    return P.Scene(start, end, angle, snake, markers, label)


def components(mask):
    """Labels of the 8-connected components of a boolean image (flood fill)."""
    lab = np.zeros(mask.shape, int)
    n = 0
    for r, c in zip(*np.nonzero(mask)):
        if lab[r, c]:
            continue
        n += 1
        stack = [(r, c)]
        while stack:
            i, j = stack.pop()
            if 0 <= i < mask.shape[0] and 0 <= j < mask.shape[1] and mask[i, j] and not lab[i, j]:
                lab[i, j] = n
                stack += [(i + di, j + dj) for di in (-1, 0, 1) for dj in (-1, 0, 1)]
    return lab


def dilate(mask):
    out = mask.copy()
    for di in (-1, 0, 1):
        for dj in (-1, 0, 1):
            out |= np.roll(np.roll(mask, di, 0), dj, 1)
    return out


@pytest.mark.parametrize("label", [0, 1])
def test_constructed_scene_label_in_geometry_and_pixels(label):
    # two gently curving snakes far apart: top one left to right, bottom one right to left
    top = chain(6.0, 3.0, [0.0, 0.1, 0.2, 0.1, 0.0, -0.1, -0.2])
    bottom = chain(25.0, 28.0, [math.pi, math.pi - 0.1, math.pi - 0.2, math.pi, math.pi + 0.1, math.pi + 0.2])
    ends = ((0, "start"), (0, "end")) if label == 1 else ((0, "start"), (1, "end"))
    scene = scene_of([top, bottom], ends, label)
    assert connected_by_paddles(scene, SPEC) == bool(label)
    image = render(scene, SPEC)
    assert image.max() == 255 and image.dtype == np.uint8
    # dashes are 2 pixels apart: one dilation joins a snake's dashes, never the two snakes
    lab = components(dilate(image > 0))
    (r0, c0), (r1, c1) = np.floor(scene.markers).astype(int)
    assert lab[r0, c0] and lab[r1, c1]
    assert (lab[r0, c0] == lab[r1, c1]) == bool(label)
    assert len(np.unique(lab)) - 1 == 2  # exactly the two snakes


def test_constructed_scene_marker_must_sit_on_a_paddle_end():
    top = chain(6.0, 3.0, [0.0] * 4)
    scene = scene_of([top], ((0, "start"), (0, "end")), 1)
    scene.markers = scene.markers + 0.5
    with pytest.raises(ValueError, match="end of 0 paddles"):
        connected_by_paddles(scene, SPEC)


def test_a_chain_broken_in_the_middle_is_two_paths():
    top = chain(6.0, 3.0, [0.0] * 6)
    start, end, angle = top
    moved = (start.copy(), end.copy(), angle)
    moved[0][3:] += [0.0, 0.5]  # the last three paddles shifted: no longer continue the first three
    moved[1][3:] += [0.0, 0.5]
    scene = scene_of([moved], ((0, "start"), (0, "end")), 1)
    assert not connected_by_paddles(scene, SPEC)


def test_generated_labels_agree_with_the_geometry():
    rng = np.random.default_rng(0)
    scenes = P.sample_scenes(rng, SPEC, 96)
    labels = np.array([s.label for s in scenes])
    assert 20 < labels.sum() < 76  # a fair coin
    for s in scenes:
        assert connected_by_paddles(s, SPEC) == bool(s.label)
        targets = [np.flatnonzero(s.snake == k) for k in (0, 1)]
        assert all(len(t) == SPEC.contour_length for t in targets)
        origin_snake = 0 if np.allclose(s.markers[0], s.start[targets[0][0]]) else 1
        assert np.allclose(s.markers[0], s.start[targets[origin_snake][0]])  # on the start of a target
        end_snake = origin_snake if s.label else 1 - origin_snake
        assert np.allclose(s.markers[1], s.end[targets[end_snake][-1]])  # on the end of the right one


def test_generated_geometry_follows_the_rules():
    rng = np.random.default_rng(1)
    L, m = SPEC.paddle_length, SPEC.paddle_margin
    for s in P.sample_scenes(rng, SPEC, 24):
        assert np.allclose(np.linalg.norm(s.end - s.start, axis=1), L)
        lo, hi = SPEC.padding, SPEC.image_size - SPEC.padding
        assert (s.start >= lo).all() and (s.start <= hi).all() and (s.end >= lo).all() and (s.end <= hi).all()
        n_distractors = len(np.unique(s.snake[s.snake >= 2]))
        assert n_distractors <= SPEC.distractor_count
        assert all((s.snake == k).sum() == SPEC.distractor_paddles for k in np.unique(s.snake[s.snake >= 2]))
        d = segment_distances(s.start, s.end, s.start, s.end)
        consecutive = np.zeros_like(d, dtype=bool)
        for k in np.unique(s.snake):
            idx = np.flatnonzero(s.snake == k)
            for i, j in zip(idx, idx[1:]):
                consecutive[i, j] = consecutive[j, i] = True
                pivot = s.end[i] + m * unit(s.angle[i])
                assert np.allclose(s.start[j], pivot + m * unit(s.angle[j]))  # the growth rule
                turn = abs((s.angle[j] - s.angle[i] + math.pi) % (2 * math.pi) - math.pi)
                assert turn <= math.pi / 2 / SPEC.continuity + 1e-9  # zero weight beyond
        np.fill_diagonal(consecutive, True)
        # every other pair keeps min_gap, up to the 1/4-pixel occupancy raster
        assert d[~consecutive].min() >= SPEC.gap - 0.4


def test_shards_are_deterministic_and_seeded():
    a = P.generate_shard(7, 3, 8, SPEC)
    b = P.generate_shard(7, 3, 8, SPEC)
    c = P.generate_shard(7, 4, 8, SPEC)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])
    assert a[0].shape == (8, 32, 32) and a[0].dtype == np.uint8


def test_splits_do_not_depend_on_workers():
    sizes = {"train": 12, "validation": 4, "test": 4}
    one, report = P.generate_pathfinder(sizes, seed=1, num_workers=1, shard_size=8)
    two, _ = P.generate_pathfinder(sizes, seed=1, num_workers=2, shard_size=8)
    for split, n in sizes.items():
        assert len(one[split]) == n and one[split].max_length() == 1024
        np.testing.assert_array_equal(one[split].inputs[0].tokens, two[split].inputs[0].tokens)
        np.testing.assert_array_equal(one[split].labels, two[split].labels)
    assert report["images_per_s_per_core"] > 0


def test_crowded_spec_fails_clearly():
    spec = P.PathfinderSpec(image_size=8, contour_length=14, max_target_trials=3)
    with pytest.raises(RuntimeError, match="no two target snakes of 14 paddles fit in 3 trials"):
        P.sample_scenes(np.random.default_rng(0), spec, 2)
    with pytest.raises(ValueError, match="contour_length=0"):
        P.PathfinderSpec(contour_length=0)
