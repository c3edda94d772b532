"""Where each point of a sweep runs: ``execution.device`` (``cpu``, ``cuda`` or ``auto``), what the
GPU backend supports, and the point's backend in its identity.

- ``cpu`` (the default): every point runs on the CPU engine; its parameters are unchanged.
- ``cuda``: every point must be one that the GPU backend supports (:data:`GPU_SUPPORT`), and a
  GPU must be there to run it; otherwise a :class:`~sgdsweep.errors.ConfigError` before any job
  starts, naming the first point that cannot run on the GPU and listing what the GPU supports.
- ``auto``: points the GPU supports run on the GPU when GPUs are expected (a CUDA device on this
  machine for a local cluster, ``execution.slurm.gpus`` for SLURM, or a named scheduler, whose
  workers are checked when shards are submitted), the others on the CPU, within one sweep.

A point routed to the GPU carries ``backend: cuda`` in its parameters (:data:`BACKEND_KEY`), so
its hash and its store differ from the same point on the CPU, whose random streams differ; a CPU
point has no backend key, so its hash is what it was before devices existed.

What the GPU backend supports is data (:class:`Support`): the dynamics of
:func:`sgdsweep.sim.gpu.run_cupy` (one-output linear regression, minibatches drawn with
replacement, heavy-ball momentum, SGD) and what it measures. A point is supported only when the
backend also measures everything the point's store needs (:func:`required_measurements`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sgdsweep.core.hardware import cuda_devices
from sgdsweep.core.noise_types import describe, select
from sgdsweep.errors import ConfigError, PointName
from sgdsweep.models import MODELS
from sgdsweep.sweep.execution import scheduler_address

#: Values of ``execution.device`` (and of ``sgdsweep run --device``).
DEVICES = ("cpu", "cuda", "auto")
#: The parameter that names a point's backend; present only on points that do not run on the CPU.
BACKEND_KEY = "backend"
#: The backend name of GPU points.
CUDA = "cuda"


@dataclass(frozen=True)
class Support:
    """What a backend runs.

    Attributes:
        models: model kind → the ``model.*`` option values it needs (equal to these).
        noise: the ``noise`` values it draws.
        methods: the ``dynamics.method`` values it integrates.
        momentum: whether heavy-ball momentum μ > 0 is supported (μ in [0, 1) as in the schema).
        max_inputs: the largest ``model.n_inputs`` it runs.
        measures: what it measures per replica (names as in :func:`required_measurements`).
    """

    models: Mapping[str, Mapping[str, Any]]
    noise: tuple[str, ...]
    methods: tuple[str, ...]
    momentum: bool
    max_inputs: int
    measures: tuple[str, ...]

    def describe(self) -> str:
        """One paragraph: what the backend supports."""
        models = "; ".join(f"{kind}" + (" with " + ", ".join(f"{k} {v}" for k, v in need.items()) if need else "")
                           for kind, need in self.models.items())
        return (f"model.kind {models}; n_inputs <= {self.max_inputs}; noise {describe(self.noise)}; "
                f"dynamics.method {describe(self.methods)}; momentum {'in [0, 1)' if self.momentum else '0'}; "
                f"measures {', '.join(self.measures)}")


def kernel_support() -> Support:
    """What :func:`sgdsweep.sim.gpu.run_cupy` runs: the linear model with one output
    (:class:`~sgdsweep.models.affine.AffineProblem` without metric or offsets), the sampled noise
    drawn with replacement and nothing else (no fresh labels, no epochs), heavy-ball SGD, N up to
    :data:`sgdsweep.sim.gpu.MAX_INPUTS`; it measures the time mean of |w − ŵ|²/N per replica
    (``weight_variance``) and the final weights (``final_weights``)."""
    from sgdsweep.sim.gpu import MAX_INPUTS

    return Support(models={"linear": {"n_outputs": 1}},
                   noise=select(sampled=True, replacement=True, fresh_labels=False),
                   methods=("sgd",), momentum=True, max_inputs=MAX_INPUTS,
                   measures=("weight_variance", "final_weights"))


#: What the GPU backend supports today (:func:`kernel_support`).
GPU_SUPPORT = kernel_support()


def required_measurements(params: Mapping[str, Any]) -> tuple[str, ...]:
    """What a point's store needs from the backend that simulates it: the streaming first and
    second moments of the weights (``weight_moments``), the step each replica diverged at
    (``divergence``), the final weights, what ``dynamics.observe`` switches on (``loss``,
    ``loss_autocorr``, ``test_loss``, ``gradient_noise``, ``escape``), and the replicas'
    Lyapunov exponents on the points of an edge search (``lyapunov``)."""
    observe = params.get("observe", {})
    need = ["weight_moments", "divergence", "final_weights"]
    if observe.get("loss"):
        need.append("loss")
        if observe.get("autocorr_lags"):
            need.append("loss_autocorr")
    if observe.get("test_loss"):
        need.append("test_loss")
    for key in ("gradient_noise", "escape"):
        if observe.get(key):
            need.append(key)
    if params.get("lyapunov"):
        need.append("lyapunov")
    return tuple(need)


def unsupported(params: Mapping[str, Any], support: Support = GPU_SUPPORT) -> str | None:
    """Why ``support``'s backend cannot run the point ``params`` (the first reason, in words), or
    None when it can."""
    kind = params["model"]
    if kind not in support.models:
        return f"model.kind {kind}"
    for key, value in support.models[kind].items():
        if params.get(key) != value:
            return f"model.{key} {params.get(key)} (the GPU runs {value})"
    if int(params.get("n_inputs", 0)) > support.max_inputs:
        return f"model.n_inputs {params['n_inputs']} (the GPU runs up to {support.max_inputs})"
    if params["noise"] not in support.noise:
        return f"noise {params['noise']}"
    if params["method"] not in support.methods:
        return f"dynamics.method {params['method']}"
    if float(params["momentum"]) != 0.0 and not support.momentum:
        return f"momentum {params['momentum']}"
    missing = [m for m in required_measurements(params) if m not in support.measures]
    if missing:
        return f"measurements {', '.join(missing)}, which the point's store needs"
    return None


def with_backend(params: Mapping[str, Any], backend: str) -> dict[str, Any]:
    """``params`` as run by ``backend``: ``backend: cuda`` added for the GPU; unchanged for cpu."""
    return dict(params) if backend == "cpu" else {**params, BACKEND_KEY: backend}


def backend_of(params: Mapping[str, Any]) -> str:
    """The backend a point's parameters name (``cpu`` without a backend key)."""
    return str(params.get(BACKEND_KEY, "cpu"))


def expected_gpus(execution: Mapping[str, Any]) -> int | None:
    """GPUs that the sweep's shards will find: this machine's CUDA devices for a local cluster,
    ``execution.slurm.gpus`` per job for SLURM, None (unknown here) for a named scheduler."""
    if scheduler_address(execution) is not None:
        return None
    if execution.get("cluster", "local") == "slurm":
        return int(execution.get("slurm", {}).get("gpus", 0))
    return cuda_devices()


def check_execution(execution: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` when ``execution.device`` asks for GPUs that will not be there,
    or ``execution.slurm.gpus`` asks SLURM for GPUs that no point would use."""
    device = execution.get("device", "cpu")
    slurm_gpus = int(execution.get("slurm", {}).get("gpus", 0))
    if slurm_gpus and device == "cpu" and execution.get("cluster", "local") == "slurm":
        raise ConfigError("execution.slurm.gpus", slurm_gpus, "0 with execution.device cpu",
                          "The SLURM jobs would hold GPUs that no point uses; set execution.device to cuda "
                          "or auto (or sgdsweep run --device cuda), or slurm.gpus to 0.")
    if slurm_gpus > int(execution.get("slurm", {}).get("cores", 1)):
        raise ConfigError("execution.slurm.gpus", slurm_gpus, "at most execution.slurm.cores",
                          "Each GPU of a job gets one Dask worker process, with a core of the job's; raise "
                          "slurm.cores or lower slurm.gpus.")
    if device != CUDA:
        return
    gpus = expected_gpus(execution)
    if gpus == 0 and execution.get("cluster", "local") == "slurm":
        raise ConfigError("execution.device", device, "cpu or auto while execution.slurm.gpus is 0",
                          "The SLURM jobs of Dask workers would have no GPU; set execution.slurm.gpus to the "
                          "GPUs per job (e.g. 1).")
    if gpus == 0:
        why = ("CuPy is not installed (pip install cupy-cuda12x or cupy-cuda13x)"
               if importlib.util.find_spec("cupy") is None else "CuPy sees no CUDA device (no GPU or no driver)")
        raise ConfigError("execution.device", device, "cpu or auto on a machine without a CUDA device",
                          f"This run's local Dask cluster would have no GPU: {why}. Run with device cpu, or on "
                          "a machine with a GPU, or name a scheduler with GPU workers (execution.scheduler).")


def router(execution: Mapping[str, Any], support: Support | None = None) -> Callable[[Mapping[str, Any], str],
                                                                                    dict[str, Any]]:
    """The function that gives each point (its parameters, and ``where`` it is for messages) its
    backend under ``execution.device``, after :func:`check_execution`; ``support`` is what the GPU
    backend runs (default :data:`GPU_SUPPORT`).

    Raises:
        ConfigError: from :func:`check_execution`, or (device cuda) naming the first point the GPU
            does not support and what the GPU supports.
    """
    device = execution.get("device", "cpu")
    if device not in DEVICES:  # the schema has checked it; a caller passing a mapping of its own
        raise ConfigError("execution.device", device, describe(DEVICES))
    check_execution(execution)
    gpus = 0 if device == "cpu" else expected_gpus(execution)
    support = GPU_SUPPORT if support is None else support

    def route(params: Mapping[str, Any], where: PointName) -> dict[str, Any]:
        if device == "cpu" or gpus == 0:  # auto without GPUs: the CPU engine
            return dict(params)
        reason = unsupported(params, support)
        if reason is None:
            return with_backend(params, CUDA)
        if device == CUDA:
            raise ConfigError("execution.device", device, "points that the GPU backend supports: "
                              + support.describe(),
                              f"The first point it cannot run is {where}: {reason}. Use device auto to run such "
                              "points on the CPU, or cpu for all (docs/gpu.md).")
        return dict(params)

    return route


def known_models(support: Support = GPU_SUPPORT) -> tuple[str, ...]:
    """The model kinds of ``support`` that the model registry knows (all of them, for a valid table)."""
    return tuple(kind for kind in support.models if kind in MODELS)


def device_override(config_path: Any, device: str | None, snakemake_args: Sequence[str] = ()) -> dict[str, Any] | None:
    """The top-level override of ``sgdsweep run --device`` (:func:`sgdsweep.sweep.config.load_sweep`'s
    ``overrides``): the config file's ``execution`` section with ``device`` replaced; None without
    ``--device``.

    Raises:
        UsageError: ``--device`` together with Snakemake's own ``--config`` after ``--`` (Snakemake
            keeps only one ``--config``, and would drop the device).
    """
    from sgdsweep.errors import UsageError
    from sgdsweep.sweep.schema import read_yaml

    if device is None:
        return None
    if any(a == "--config" or a.startswith("--config=") or a == "-C" for a in snakemake_args):
        raise UsageError(f"--device {device} and Snakemake's --config after -- cannot be combined; set "
                         "execution.device in the config file instead of --device")
    raw = read_yaml(config_path)
    execution = raw.get("execution", {}) if isinstance(raw, Mapping) else {}
    if not isinstance(execution, Mapping):  # the schema's message names it
        return None
    return {"execution": {**execution, "device": device}}


def snakemake_config(device: str | None) -> list[str]:
    """Snakemake's arguments that give its jobs the same ``execution.device`` as ``--device``
    (Snakemake merges ``--config`` mappings into the config file's, key by key)."""
    return [] if device is None else ["--config", f"execution={{device: {device}}}"]
