"""The gradient-noise types (docs/physics.md §7), defined once: every list of noise types in the
package is a subset of :data:`NOISE` chosen by the properties below.

A step's noise is either *sampled* (the gradient of a batch of S samples drawn from the data
set) or *added* (a draw added to the full gradient). Properties of each type:

- ``sampled``: the step's gradient is that of a drawn batch; ``mode`` is then how the batch is
  drawn (:data:`MODE`, the code that :func:`sgdsweep.sim.noise.sample_indices` reads);
- ``fresh_labels``: every step draws new label noise on its batch (needs a teacher);
- ``gaussian``: added noise drawn Gaussian (the SDE integrator accepts exactly these);
- ``matched``: the noise's covariance is that of the data's per-sample gradients at the current
  weights (sampled batches, or added noise drawn to match them); else isotropic or a model's own
  fixed C;
- ``replacement``: that covariance is the with-replacement one, C/S (else the
  without-replacement (P − S)/(S(P − 1)) factor);
- ``independent_steps``: each step's noise is independent of earlier steps' (not so for
  ``epoch``, whose batches partition one permutation per epoch);
- ``needs_data``: the type needs a data set (a problem with ``n_samples``); the others run on
  additive problems with a known noise covariance;
- ``nu``: the degrees of freedom ν of heavy-tailed added noise: its Gaussian draw times
  √((ν − 2)/V), V ~ χ²_ν (ν normals more per step), multivariate Student-t of the same
  covariance (finite variance needs ν > 2); None for the others.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NoiseType:
    """One value of the ``noise`` axis and its properties (see the module docstring)."""

    name: str
    sampled: bool
    gaussian: bool
    matched: bool
    needs_data: bool
    mode: int | None = None
    replacement: bool = False
    fresh_labels: bool = False
    independent_steps: bool = True
    nu: int | None = None
    description: str = ""


#: Every noise type, in the order that lists of them are shown (sampled first).
NOISE: dict[str, NoiseType] = {t.name: t for t in (
    NoiseType("minibatch", sampled=True, gaussian=False, matched=True, needs_data=True, mode=0,
              description="S distinct samples each step"),
    NoiseType("minibatch_replace", sampled=True, gaussian=False, matched=True, needs_data=True, mode=1,
              replacement=True, description="S samples drawn with replacement"),
    NoiseType("epoch", sampled=True, gaussian=False, matched=True, needs_data=True, mode=2,
              independent_steps=False, description="reshuffle once per epoch and walk through it"),
    NoiseType("label", sampled=True, gaussian=False, matched=True, needs_data=True, mode=0,
              fresh_labels=True, description="fresh label noise on a noiseless teacher"),
    NoiseType("gaussian", sampled=False, gaussian=True, matched=False, needs_data=False,
              description="isotropic, matched to the minibatch trace at the minimum (a model's own C "
                          "where it has one)"),
    NoiseType("gaussian_matched", sampled=False, gaussian=True, matched=True, needs_data=True,
              description="Gaussian with the minibatch covariance at the current weights"),
    NoiseType("student_t", sampled=False, gaussian=False, matched=True, needs_data=False, nu=4,
              description="Student-t (nu = 4) with the covariance of gaussian_matched (of a model's "
                          "own C where it has one)"),
)}


def select(**properties: object) -> tuple[str, ...]:
    """The names of the noise types whose properties equal ``properties``, in :data:`NOISE` order
    (``select(sampled=True)`` → the sampling types)."""
    unknown = set(properties) - set(NoiseType.__dataclass_fields__)
    if unknown:
        raise TypeError(f"no noise-type property {', '.join(sorted(unknown))}")
    return tuple(name for name, t in NOISE.items()
                 if all(getattr(t, key) == value for key, value in properties.items()))


#: Every noise type's name.
ALL: tuple[str, ...] = tuple(NOISE)
#: Noise types that draw samples from the data set.
SAMPLING_NOISE: tuple[str, ...] = select(sampled=True)
#: Sampled batches drawn afresh each step and nothing else (no epoch order, no label noise).
MINIBATCH_NOISE: tuple[str, ...] = select(sampled=True, independent_steps=True, fresh_labels=False)
#: Noise types that add drawn noise to the full gradient.
ADDED_NOISE: tuple[str, ...] = select(sampled=False)
#: Added noise drawn with the covariance of the data's per-sample gradients at the current weights
#: (or a model's own C where it has one, for the data-free types among them).
MATCHED_ADDED_NOISE: tuple[str, ...] = select(sampled=False, matched=True)
#: Noise types drawn Gaussian (added to the full gradient).
GAUSSIAN_NOISE: tuple[str, ...] = select(gaussian=True)
#: Noise types the SDE integrator accepts: its noise is Gaussian by definition.
SDE_NOISE: tuple[str, ...] = GAUSSIAN_NOISE
#: Noise types that need no data set (additive problems: a model's own noise covariance).
DATA_FREE_NOISE: tuple[str, ...] = select(needs_data=False)
#: Noise types of a data set without a teacher (every type but fresh label noise).
UNLABELLED_NOISE: tuple[str, ...] = select(fresh_labels=False)
#: Sampling type → how the kernel draws a batch: 0 S distinct samples, 1 with replacement,
#: 2 the next batch of the epoch's permutation.
MODE: dict[str, int] = {name: t.mode for name, t in NOISE.items() if t.sampled and t.mode is not None}


def describe(names: tuple[str, ...]) -> str:
    """``names`` as prose: ``a, b or c``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
