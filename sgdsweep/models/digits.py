"""``digits``: one linear layer on scikit-learn's bundled 8×8 digits (docs/physics.md §3, the offline
substitute for Han, Park, Lee & Han 2021's MNIST).

The 1797 images (pixels 0–16, divided by ``pixel_scale``) lose the pixels that are zero in every
image (so Σxx is invertible); targets are one-hot (10 outputs). A seeded random
``test_fraction`` of the images is held out; the training loss is ``1/(2P) Σ ‖W x − y‖²`` over
the rest and the test loss the same average over the held-out images. The data ship with
scikit-learn: nothing is downloaded at run time.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from sgdsweep.core.noise_types import UNLABELLED_NOISE
from sgdsweep.errors import ConfigError, PointName
from sgdsweep.models.affine import AffineProblem
from sgdsweep.models.base import data_rng

AXES = ("lr", "batch_size", "momentum", "noise")
OPTIONS: dict[str, Any] = {"test_fraction": 0.2, "pixel_scale": 16.0}
#: every type but fresh label noise (the digits have no teacher)
NOISE_TYPES = UNLABELLED_NOISE
#: The fluctuation–dissipation observables of sampled batches (``dynamics.observe.gradient_noise``).
OBSERVES = frozenset({"gradient_noise"})


def data_params(params: Mapping[str, Any]) -> dict[str, Any]:
    return {"model": "digits", "seed": params["seed"], "test_fraction": params["test_fraction"],
            "pixel_scale": params["pixel_scale"]}


def load_digit_images() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 digit images (64 pixels, 0–16) and their labels, as
    ``sklearn.datasets.load_digits`` returns them: read from the data file that scikit-learn ships
    (``sklearn/datasets/data/digits.csv.gz``) without importing scikit-learn, which imports SciPy's
    sparse matrices (seconds that every plan of a digits sweep would pay); through
    ``load_digits`` where that file is not found."""
    import gzip
    import importlib.util
    from pathlib import Path

    found = importlib.util.find_spec("sklearn")
    for root in (found.submodule_search_locations or []) if found else []:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, mode="rt", encoding="utf-8") as fh:
                data = np.loadtxt(fh, delimiter=",")
            return data[:, :-1], data[:, -1].astype(int)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.data, bunch.target


@functools.lru_cache(maxsize=4)
def _make(test_fraction: float, pixel_scale: float, seed: int) -> AffineProblem:
    images, labels = load_digit_images()
    x_all = images.astype(np.float64) / pixel_scale
    y_all = np.eye(10)[labels]
    rng = data_rng({"model": "digits", "test_fraction": test_fraction, "seed": seed})
    order = rng.permutation(len(x_all))
    n_test = int(round(test_fraction * len(x_all)))
    test, train = order[:n_test], order[n_test:]
    lit = np.any(x_all[train] != 0, axis=0)
    x_all = x_all[:, lit]  # pixels never lit in training: Σxx singular
    xt, yt = x_all[test], y_all[test]
    sxx_t = xt.T @ xt / max(1, n_test)
    syx_t = yt.T @ xt / max(1, n_test)
    yy_t = 0.5 * float(np.mean(np.sum(yt * yt, axis=1))) if n_test else 0.0

    test_quadratic = (sxx_t, syx_t, yy_t) if n_test else None  # the held-out images' loss
    problem = AffineProblem("digits", x_all[train], y_all[train], noise_types=NOISE_TYPES,
                            test_quadratic=test_quadratic)
    problem.pixels = np.flatnonzero(lit)  # image pixel (row-major in 8×8) of each input
    problem.n_pixels = lit.size
    return problem


def check_point(params: Mapping[str, Any], where: PointName) -> None:
    p = _make(float(params["test_fraction"]), float(params["pixel_scale"]), int(params["seed"])).n_samples
    if params["batch_size"] > p:
        raise ConfigError("grid.batch_size", params["batch_size"], f"at most the {p} training images",
                          f"At {where}.")


def make_problem(d: Mapping[str, Any]) -> AffineProblem:
    return _make(float(d["test_fraction"]), float(d["pixel_scale"]), int(d["seed"]))
