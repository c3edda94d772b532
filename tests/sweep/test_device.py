"""``execution.device`` and ``sgdsweep run --device``: what the GPU backend supports, the routing
of each point, the backend in a point's identity, the clear errors before any job starts, Dask's
GPU worker resource on a real cluster, and the SLURM job script that asks for GPUs.

No test here needs a GPU. Where a test needs routing to reach the GPU, it gives the router the
support table of a GPU backend that measured everything a point store needs (:func:`full_support`),
since today's kernel (:data:`sgdsweep.sweep.device.GPU_SUPPORT`) measures too little for any point.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from conftest import REPO, cli, run_cli, tiny_config, write_yaml

from sgdsweep.core.identity import content_hash
from sgdsweep.core.noise_types import NOISE
from sgdsweep.errors import ConfigError, SgdsweepError
from sgdsweep.models import MODELS
from sgdsweep.run import gpus
from sgdsweep.run.cluster import slurm_cluster_kwargs
from sgdsweep.sweep import device
from sgdsweep.sweep.config import build_sweep

#: A scheduler address: build_sweep only checks its form, and routing then expects GPUs there.
SCHEDULER = "tcp://127.0.0.1:8786"
NO_CUDA = device.cuda_devices() == 0


def full_support() -> device.Support:
    """Today's table with every measurement a point store can need."""
    need = ("weight_moments", "divergence", "final_weights", "loss", "loss_autocorr", "test_loss",
            "gradient_noise", "escape")
    return dataclasses.replace(device.GPU_SUPPORT, measures=need)


def hashes(sweep) -> list[str]:
    return [p.hash for p in sweep.points]


# --- the support table ------------------------------------------------------------------------


def test_the_support_table_names_what_the_registry_and_the_kernel_have():
    support = device.GPU_SUPPORT
    assert device.known_models(support) == tuple(support.models)
    for kind in support.models:
        assert set(support.noise) <= set(MODELS[kind].NOISE_TYPES), kind
    assert support.noise == ("minibatch_replace",)  # the kernel draws with replacement, nothing else
    assert all(NOISE[n].sampled and NOISE[n].replacement for n in support.noise)
    text = support.describe()
    assert "model.kind linear with n_outputs 1" in text and "noise minibatch_replace" in text
    assert "measures weight_variance, final_weights" in text


def test_a_point_store_needs_more_than_todays_kernel_measures():
    sweep = build_sweep(tiny_config())
    params = sweep.points[0].params
    assert device.unsupported({**params, "noise": "minibatch_replace"}) == (
        "measurements weight_moments, divergence, loss, loss_autocorr, test_loss, which the point's store needs")
    full = full_support()
    assert device.unsupported({**params, "noise": "minibatch_replace"}, full) is None
    assert device.unsupported(params, full) == "noise minibatch"
    assert device.unsupported({**params, "noise": "minibatch_replace", "n_outputs": 2}, full).startswith(
        "model.n_outputs 2")
    assert device.unsupported({**params, "model": "quadratic"}, full) == "model.kind quadratic"


# --- identity ---------------------------------------------------------------------------------


def test_cpu_points_keep_their_hashes_whatever_the_device_setting():
    """No device key, device cpu, and device auto without a GPU give the same points, and no CPU
    point carries a backend: its hash is that of its parameters as before devices existed."""
    plain = build_sweep({k: v for k, v in tiny_config().items() if k != "execution"})
    for execution in ({}, {"device": "cpu"}, {"device": "auto"}):
        sweep = build_sweep(tiny_config(execution=execution))
        assert hashes(sweep) == hashes(plain), execution
        for p in sweep.points:
            assert device.BACKEND_KEY not in p.params
            assert p.hash == content_hash(dict(p.params))


def test_the_same_point_on_the_gpu_has_another_hash_and_shard(monkeypatch):
    monkeypatch.setattr(device, "GPU_SUPPORT", full_support())
    grid = {"noise": "minibatch_replace"}
    cpu = build_sweep(tiny_config(grid=grid, execution={"scheduler": SCHEDULER}))
    gpu = build_sweep(tiny_config(grid=grid, execution={"scheduler": SCHEDULER, "device": "cuda"}))
    assert len(gpu.points) == len(cpu.points) == 4
    for c, g in zip(cpu.points, gpu.points):
        assert g.params == {**c.params, "backend": "cuda"}
        assert g.hash != c.hash and g.shard != c.shard
    assert not set(hashes(gpu)) & set(hashes(cpu))


def test_auto_sends_supported_points_to_the_gpu_and_the_rest_to_the_cpu(monkeypatch):
    monkeypatch.setattr(device, "GPU_SUPPORT", full_support())
    grid = {"noise": ["minibatch_replace", "minibatch"]}
    auto = build_sweep(tiny_config(grid=grid, execution={"scheduler": SCHEDULER, "device": "auto"}))
    cpu = build_sweep(tiny_config(grid=grid, execution={"scheduler": SCHEDULER}))
    backends = {p.params["noise"]: {device.backend_of(q.params) for q in auto.points
                                    if q.params["noise"] == p.params["noise"]} for p in auto.points}
    assert backends == {"minibatch_replace": {"cuda"}, "minibatch": {"cpu"}}
    same = {p.hash for p in auto.points if p.params["noise"] == "minibatch"}
    assert same == {p.hash for p in cpu.points if p.params["noise"] == "minibatch"}
    assert not {p.shard for p in auto.points if p.params["noise"] == "minibatch"} & {
        p.shard for p in auto.points if p.params["noise"] == "minibatch_replace"}


# --- errors before any job starts -------------------------------------------------------------


def test_cuda_names_the_first_point_the_gpu_cannot_run_and_what_it_supports(monkeypatch):
    with pytest.raises(ConfigError) as err:  # today's table: no point's store can be measured on the GPU
        build_sweep(tiny_config(grid={"noise": "minibatch_replace"},
                                execution={"scheduler": SCHEDULER, "device": "cuda"}))
    text = str(err.value)
    assert "config key 'execution.device': got 'cuda'" in text
    assert "model.kind linear with n_outputs 1" in text and "noise minibatch_replace" in text
    assert "point lr=0.2, batch_size=2" in text and "measurements weight_moments" in text
    monkeypatch.setattr(device, "GPU_SUPPORT", full_support())
    with pytest.raises(ConfigError, match=r"first point it cannot run is point lr=0\.2, batch_size=2, "
                                          r"momentum=0.0, samples_per_param=10.0, noise=minibatch: noise minibatch"):
        build_sweep(tiny_config(grid={"noise": ["minibatch_replace", "minibatch"]},
                                execution={"scheduler": SCHEDULER, "device": "cuda"}))


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is present: the error is for machines without one")
def test_cuda_without_a_device_is_refused_by_every_command_before_anything_is_written(tmp_path):
    path = write_yaml(tmp_path / "gpu.yaml", tiny_config(execution={"device": "cuda"}))
    for args in (("validate", str(path)), ("plan", str(path)), ("run", str(path))):
        proc = cli(*args, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert "config key 'execution.device': got 'cuda'" in proc.stderr
        assert "CuPy is not installed" in proc.stderr or "CuPy sees no CUDA device" in proc.stderr
    plain = write_yaml(tmp_path / "cpu.yaml", tiny_config())
    proc = cli("run", str(plain), "--device", "cuda", cwd=tmp_path)
    assert proc.returncode == 2 and "got 'cuda'" in proc.stderr, proc.stderr
    proc = cli("run", str(plain), "--device", "auto", "--", "--config", "seed=4", cwd=tmp_path)
    assert proc.returncode == 2 and "--device auto and Snakemake's --config" in proc.stderr, proc.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.workflow
@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is present: the config would be valid without --device")
def test_run_device_overrides_the_config_for_snakemake_too(tmp_path):
    """A config asking for cuda on a machine without one runs (dry) with --device cpu: the
    override reaches Snakemake's own reading of the config, or it would refuse the sweep."""
    path = write_yaml(tmp_path / "gpu.yaml", tiny_config(execution={"device": "cuda"}))
    proc = run_cli("run", str(path), "--device", "cpu", "-n", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "simulate" in proc.stdout + proc.stderr


@pytest.mark.parametrize("execution, key, expected", [
    ({"cluster": "slurm", "slurm": {"gpus": 1}}, "execution.slurm.gpus", "0 with execution.device cpu"),
    ({"cluster": "slurm", "device": "cuda"}, "execution.device", "cpu or auto while execution.slurm.gpus is 0"),
    ({"cluster": "slurm", "device": "auto", "slurm": {"gpus": 4, "cores": 2}}, "execution.slurm.gpus",
     "at most execution.slurm.cores"),
])
def test_slurm_gpu_settings_that_cannot_work_are_refused(execution, key, expected):
    with pytest.raises(ConfigError, match=f"config key '{key}'.*allowed: {expected}"):
        build_sweep(tiny_config(execution=execution))


# --- scheduling on real engines ---------------------------------------------------------------


def _where(_: int) -> str:
    from distributed import get_worker

    return get_worker().name


def test_gpu_tasks_run_only_on_the_worker_that_advertises_a_gpu():
    """A real two-worker cluster of :func:`gpus.gpu_local_cluster`, one CPU and one GPU worker (the
    GPU resource is Dask's count, not a device): every task of GPU points runs on the GPU worker;
    GPU workers see only their own device; a cluster without one is refused before submitting."""
    from distributed import Client, LocalCluster

    sweep = build_sweep(tiny_config())
    cpu_batch = [p.spec() for p in sweep.points[:2]]
    gpu_batch = [{**s, "params": device.with_backend(s["params"], "cuda")} for s in cpu_batch]
    assert gpus.task_resources(cpu_batch) is None and gpus.task_resources(gpu_batch) == {"GPU": 1}
    with gpus.gpu_local_cluster(1, 1) as cluster, Client(cluster) as client:
        info = client.scheduler_info(n_workers=-1)["workers"]
        assert sorted(w["resources"].get("GPU", 0) for w in info.values()) == [0, 1]
        ran = client.gather([client.submit(_where, i, resources=gpus.task_resources(gpu_batch), pure=False)
                             for i in range(12)])
        assert set(ran) == {"gpu-0"}
        visible = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
        assert sorted(visible.values(), key=str) == ["0", None]
        gpus.check_gpu_workers(client, [cpu_batch, gpu_batch])
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False) as cluster, Client(cluster) as client:
        gpus.check_gpu_workers(client, [cpu_batch])  # CPU tasks need no GPU worker
        with pytest.raises(SgdsweepError, match="1 task.* none of the cluster's 1 worker.* advertises the Dask "
                                                "resource GPU"):
            gpus.check_gpu_workers(client, [cpu_batch, gpu_batch])


def test_a_gpu_shard_is_sent_to_the_gpu_worker_and_never_simulated_on_the_cpu(tmp_path):
    """run_shard on a real cluster: the task of GPU points reaches the GPU worker, which refuses
    it (no GPU shard path yet) rather than simulating it with the CPU engine; nothing is stored."""
    from sgdsweep.run.execute import run_shard

    sweep = build_sweep(tiny_config())
    spec = {**sweep.points[0].spec()}
    spec["params"] = device.with_backend(spec["params"], "cuda")
    spec["hash"] = content_hash(spec["params"])
    points_dir = tmp_path / "points"
    points_dir.mkdir()
    spec_path = tmp_path / "shard.json"
    spec_path.write_text(json.dumps({"shard": "s", "points": [spec], "points_dir": str(points_dir)}))
    refused = pytest.raises(SgdsweepError, match="names backend cuda, but sgdsweep has no GPU shard path")
    with gpus.gpu_local_cluster(0, 1, worker_options={"env": {"PYTHONPATH": str(REPO)}}) as cluster, refused:
        run_shard(spec_path, tmp_path / "receipt.json", {"scheduler": cluster.scheduler_address})
    assert not list(points_dir.glob("*.npz")) and not (tmp_path / "receipt.json").exists()


def test_slurm_jobs_ask_for_gpus_and_their_workers_advertise_them():
    """The job script dask-jobqueue renders (without submitting) from execution.slurm."""
    from dask_jobqueue import SLURMCluster

    execution = build_sweep(tiny_config(execution={"cluster": "slurm", "device": "auto",
                                                   "slurm": {"gpus": 2, "cores": 4}})).config["execution"]
    kwargs = slurm_cluster_kwargs(execution)
    assert kwargs["job_extra_directives"] == ["--gres=gpu:2"] and kwargs["processes"] == 2
    with SLURMCluster(**{**kwargs, "scheduler_options": {"host": "127.0.0.1"}}) as cluster:
        script = cluster.job_script()
    assert "#SBATCH --gres=gpu:2" in script
    assert "--nworkers 2" in script and "--resources GPU=1" in script
    plain = slurm_cluster_kwargs(build_sweep(tiny_config(execution={"cluster": "slurm"})).config["execution"])
    assert "job_extra_directives" not in plain and plain["processes"] == plain["cores"]


def test_gpu_workers_take_the_gpus_this_process_was_given(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpus.device_ids(2) == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")  # e.g. the GPUs SLURM gave the job
    assert gpus.device_ids(2) == ["5", "7"]
    with pytest.raises(ValueError, match="3 GPU workers but CUDA_VISIBLE_DEVICES=5,7 names 2"):
        gpus.device_ids(3)


def test_local_clusters_get_one_worker_per_gpu():
    assert gpus.local_gpus({"device": "cpu"}) == 0
    assert gpus.local_gpus({"device": "cuda"}) == device.cuda_devices()
    assert gpus.local_cpu_workers({"device": "auto"}, 3) == 3
    assert gpus.local_cpu_workers({"device": "cuda"}, 3) == (0 if device.cuda_devices() else 3)


def test_provenance_names_the_devices():
    from sgdsweep.store.provenance import provenance

    text = provenance()["devices"]
    assert text.startswith("cpu (") and ("cuda: none" if NO_CUDA else "cuda: ") in text

