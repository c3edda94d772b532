"""The exact stationary second moment of linear regression: the equation for M alone against the
2N×2N equation for Z = E[z zᵀ], z = (δ_t, δ_{t−1}), measured in the same run.

``sgdsweep.theory.linear.stationary_second_moment`` eliminates K = E[δ_t δ_{t−1}ᵀ] and solves
N(N+1)/2 unknowns. The baseline here is the formulation it replaced (sgdsweep before
2026-11-27): Z = B̄ Z B̄ᵀ + λ²[[E[AMA] − HMH + C, 0], [0, 0]] solved densely on the symmetric
half of Z, N(2N+1) unknowns with momentum (the same as M's without). Printed per (N, μ): both
times (best of --repeat), their ratio and the largest relative difference of M. Isotropic
teacher data, P = 10N, λ = 0.1, S = 10, minibatch noise, one thread of BLAS as numpy has it.

Then the leading-order theories a point reports next to the exact one (continuous-time
covariance, detailed-balance eigenvalues, |eig Q|) for the same H and C:
``sgdsweep.theory.lyapunov.leading_order`` against the three functions it replaced in
``predict`` (each validating H and C itself), with the largest relative difference.

    python benchmarks/theory_linear.py [--n 10 20 25] [--repeat 3]
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np

from sgdsweep.models import linear
from sgdsweep.theory import linear as th
from sgdsweep.theory import lyapunov as ly


def z_system_moment(data, lr: float, batch_size: int, momentum: float, noise: str = "minibatch") -> np.ndarray:
    """M from the 2N×2N stationarity equation for Z (the baseline; dense, symmetric half)."""
    n = data.n_inputs
    eye = np.eye(n)
    if momentum == 0.0:
        b = eye - lr * data.sxx
    else:
        b = np.block([[(1.0 + momentum) * eye - lr * data.sxx, -momentum * eye], [eye, np.zeros((n, n))]])
    d = b.shape[0]
    fl = lr * lr * th._fluctuation_matrix(data, batch_size, noise)
    rhs = np.zeros((d, d))
    rhs[:n, :n] = lr * lr * th.noise_covariance(data, batch_size, noise)
    i, j = np.tril_indices(d)
    off = (i != j).astype(float)
    bi, bj = b[i], b[j]
    op = -(bi[:, i] * bj[:, j] + off * (bi[:, j] * bj[:, i]))
    op[np.diag_indices_from(op)] += 1.0
    top = np.flatnonzero((i < n) & (j < n))
    rows = fl[i[top] * n + j[top]]
    op[np.ix_(top, top)] -= rows[:, i[top] * n + j[top]] + off[top] * rows[:, j[top] * n + i[top]]
    z = np.empty((d, d))
    z[i, j] = z[j, i] = np.linalg.solve(op, rhs[i, j])
    return z[:n, :n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[10, 20, 25])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("N  momentum  Z system (baseline)  M alone (sgdsweep)  ratio  max relative difference of M")
    for n in args.n:
        data = linear.make_problem({"n_inputs": n, "n_outputs": 1, "n_samples": 10 * n, "label_noise": 0.5,
                                    "inputs": "isotropic", "wishart_ratio": None, "labels": "teacher",
                                    "noiseless": False, "seed": 0})
        for mu in (0.0, 0.6):
            base = z_system_moment(data, 0.1, 10, mu)
            new = th.stationary_second_moment(data, 0.1, 10, mu)
            diff = float(np.abs(new - base).max() / np.abs(base).max())
            number = max(3, int(200 / n))
            t_base = min(timeit.repeat(lambda data=data, mu=mu: z_system_moment(data, 0.1, 10, mu), number=number,
                                       repeat=args.repeat)) / number
            t_new = min(timeit.repeat(lambda data=data, mu=mu: th.stationary_second_moment(data, 0.1, 10, mu),
                                      number=number, repeat=args.repeat)) / number
            print(f"{n:<3d}{mu:9.1f}  {t_base * 1e3:16.2f} ms  {t_new * 1e3:15.2f} ms  "
                  f"{t_base / t_new:5.1f}  {diff:.1e}")
    print("\nN  three calls (baseline)  leading_order (sgdsweep)  ratio  max relative difference")
    for n in args.n:
        data = linear.make_problem({"n_inputs": n, "n_outputs": 1, "n_samples": 10 * n, "label_noise": 0.5,
                                    "inputs": "isotropic", "wishart_ratio": None, "labels": "teacher",
                                    "noiseless": False, "seed": 0})
        h, c = data.sxx, th.noise_covariance(data, 10, "minibatch")

        def three(h=h, c=c):
            return (ly.continuous_covariance(h, c, 0.1), ly.detailed_balance_eigenvalues(h, c, 0.1),
                    ly.q_eigenvalue_magnitudes(h, c))

        diff = max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(ly.leading_order(h, c, 0.1), three()))
        number = max(10, int(2000 / n))
        t_base = min(timeit.repeat(three, number=number, repeat=args.repeat)) / number
        t_new = min(timeit.repeat(lambda h=h, c=c: ly.leading_order(h, c, 0.1), number=number,
                                  repeat=args.repeat)) / number
        print(f"{n:<3d}{t_base * 1e3:19.3f} ms  {t_new * 1e3:21.3f} ms  {t_base / t_new:5.1f}  {diff:.1e}")


if __name__ == "__main__":
    main()
