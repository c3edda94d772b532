"""The ``sgdsweep`` command.

User verbs: ``run`` (validate, then run the Snakemake workflow), ``validate`` and ``plan``.
Workflow verbs (called by the rules in ``workflow/rules/``): ``simulate-shard``, ``aggregate``,
``fit``, ``report``; ``cluster-daemon`` runs the shared local Dask cluster of a workflow run.

Exit codes: 0 success, 1 a failed run, 2 bad input (config, arguments, environment).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from .errors import SgdsweepError, UsageError

log = logging.getLogger("sgdsweep")


def _setup_logging(log_file: str | None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, mode="w"))
    fmt = logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for h in handlers:
        h.setFormatter(fmt)
    root = logging.getLogger("sgdsweep")
    root.handlers[:] = handlers
    root.setLevel(logging.INFO)
    root.propagate = False


def _read_json(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"file not found: {path}") from None
    except ValueError as exc:
        raise UsageError(f"{path} is not valid JSON ({exc})") from None


def _read_ensemble(path: str):
    """The ensemble at ``path`` (:func:`sgdsweep.aggregate.load_ensemble`), or a
    :class:`UsageError` saying what is there instead."""
    import zarr

    from .aggregate import load_ensemble

    if not Path(path).exists():
        raise UsageError(f"ensemble not found: {path} (the aggregate step writes it: "
                         f"'sgdsweep aggregate SWEEP_SPEC --out {path}')")
    try:
        return load_ensemble(path)
    except zarr.errors.NodeNotFoundError:
        raise UsageError(f"{path} is not an ensemble: no Zarr group there (give the ensemble.zarr that "
                         "'sgdsweep aggregate' wrote)") from None


def cmd_validate(args: argparse.Namespace) -> int:
    from .config import load_sweep

    sweep = load_sweep(args.config)
    swept = [c for c in sweep.coords if len({p.params.get(c) for p in sweep.points}) > 1]
    print(f"{args.config}: valid. Sweep '{sweep.name}': {len(sweep.points)} points in "
          f"{len(sweep.shards)} shard(s); swept axes: {', '.join(swept) or 'none'}; "
          f"results in {sweep.directory}/")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from .config import load_sweep
    from .plan import explain, format_explanation

    sweep = load_sweep(args.config)
    print(format_explanation(sweep, explain(sweep), verbose=not args.summary))
    return 0


def _snakefile() -> Path:
    from .paths import workflow_root

    return workflow_root() / "Snakefile"


def cmd_run(args: argparse.Namespace) -> int:
    from .config import load_sweep

    from .cluster import scheduler_address
    from .locking import ensure_writable

    sweep = load_sweep(args.config)  # fail fast, with our message, before Snakemake starts
    scheduler_address(sweep.config["execution"])
    ensure_writable(sweep.directory)
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(_snakefile()), "--configfile",
           str(args.config), "--cores", str(args.cores)]
    if args.dry_run:
        cmd.append("--dry-run")
    cmd += args.snakemake_args
    log.info("sweep '%s': %d points; running %s", sweep.name, len(sweep.points), " ".join(cmd))
    with subprocess.Popen(cmd) as proc:
        # only for a plain local run: extra Snakemake arguments (a profile, an executor, a dry
        # run, a target) may mean jobs elsewhere or none; then the first shard job starts it
        if not args.dry_run and not args.snakemake_args and not os.environ.get("SNAKEMAKE_PROFILE"):
            try:
                _start_cluster_early(sweep, proc.pid)
            except (OSError, SgdsweepError) as exc:  # the first shard job starts it instead
                log.warning("could not start the local Dask cluster early (%s); the shard jobs will", exc)
        return proc.wait()


def _start_cluster_early(sweep, snakemake_pid: int) -> None:
    """Start the run's shared local Dask cluster now, while Snakemake starts, when the sweep has
    points to simulate and would run them on it (see :mod:`sgdsweep.cluster`); its first shard
    job then finds the workers booted. Any other case is left to the shard jobs."""
    from .cluster import run_id, scheduler_address, start_shared_cluster, worker_count
    from .plan import PlanFiles
    from .store import complete_points

    execution = sweep.config["execution"]
    if scheduler_address(execution) is not None or execution.get("cluster", "local") != "local":
        return
    plan = PlanFiles(sweep.directory)
    hashes = [p.hash for p in sweep.points]
    todo = len(hashes) - len(complete_points(plan.points_dir, hashes))
    if todo == 0:
        return
    workers = worker_count(execution)
    log.info("%d of %d points to simulate: starting the local Dask cluster (%d workers) while Snakemake starts",
             todo, len(hashes), workers)
    start_shared_cluster(plan.cluster_dir, run_id(snakemake_pid), workers, execution.get("host", "127.0.0.1"))


def cmd_simulate_shard(args: argparse.Namespace) -> int:
    from .execute import run_shard

    run_shard(Path(args.spec), Path(args.receipt), _read_json(args.execution), Path(args.cluster_dir))
    return 0


def cmd_aggregate(args: argparse.Namespace) -> int:
    from .aggregate import build_ensemble, write_ensemble
    from .cluster import RUN_ID_ENV, release_shared_cluster

    if args.release_cluster and RUN_ID_ENV in os.environ:
        if release_shared_cluster(Path(args.release_cluster), os.environ[RUN_ID_ENV]):
            log.info("simulation done: the run's local Dask cluster is stopping")
    ds = build_ensemble(_read_json(args.sweep_spec))
    write_ensemble(ds, args.out)
    log.info("ensemble with %d points written to %s", ds.sizes["point"], args.out)
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from .fit import fit_ensemble
    from .paths import atomic_write_text

    fits = fit_ensemble(_read_ensemble(args.ensemble), _read_json(args.spec))
    atomic_write_text(args.out, json.dumps(fits, indent=1) + "\n")
    for kind, results in fits.items():
        if kind in ("skipped", "settings"):
            continue
        for res in results:
            for name, q in (res.get("params") or {}).items():
                if q and q.get("estimate") is not None:
                    lo, hi = (f"{v:.5g}" if v is not None else "?" for v in q["interval"])
                    log.info("fit %s %s%s = %.5g [%s, %s] (%s; theory %s, inside: %s)", kind, name,
                             f" at {res['group']}" if res["group"] else "", q["estimate"], lo, hi,
                             q["interval_method"], q["theory"], q["theory_inside"])
    for kind, why in fits.get("skipped", {}).items():
        log.info("fit %s not run: %s", kind, why)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .report import build_report, figure_pool

    pool = figure_pool(args.jobs)  # the workers boot while this process reads its inputs
    try:
        from .paths import atomic_write_text

        text = build_report(_read_ensemble(args.ensemble), _read_json(args.fits), _read_json(args.spec),
                            figures_dir=args.figures, pool=pool)
    finally:
        if pool is not None:
            pool.shutdown()
    atomic_write_text(args.out, text)
    log.info("report written to %s", args.out)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .share import export_sweep

    manifest = export_sweep(args.sweep_dir, args.dest)
    print(f"exported sweep '{manifest['sweep']}' ({len(manifest['points'])} points, "
          f"{len(manifest['members'])} members) to {args.dest}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from .share import verify

    manifest = verify(args.file)
    print(f"{args.file}: OK — sweep '{manifest['sweep']}', {len(manifest['points'])} points, "
          f"{len(manifest['members'])} members match their SHA-256, schema {manifest['schema_version']}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from .share import import_sweep

    target = import_sweep(args.file, args.results_dir)
    print(f"imported into {target}/; re-run fits and report without simulating: "
          f"sgdsweep run {target}/config.yaml")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from .share import merge_exports

    manifest = merge_exports(args.files, args.out)
    print(f"merged {len(args.files)} exports into {args.out}: {len(manifest['points'])} points")
    return 0


def cmd_cluster_daemon(args: argparse.Namespace) -> int:
    from .cluster import serve

    serve(Path(args.state), args.workers, args.run_id, args.host)
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sgdsweep", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="validate a config and run its sweep through Snakemake",
                       usage="sgdsweep run [CONFIG] [--cores N] [-n] [-- SNAKEMAKE ARGUMENTS]")
    p.add_argument("config", nargs="?", default="config/config.yaml", help="sweep config (YAML)")
    p.add_argument("--cores", type=_positive_int, default=os.cpu_count() or 1, help="Snakemake cores")
    p.add_argument("-n", "--dry-run", action="store_true", help="only show what would run")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("validate", help="check a config and print its size")
    p.add_argument("config")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("plan", help="list the points a run would simulate")
    p.add_argument("config")
    p.add_argument("-s", "--summary", action="store_true", help="only the counts, not one line per point")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("export", help="write a finished sweep to one verifiable zip file (path or fsspec URL)")
    p.add_argument("sweep_dir", help="results/<sweep>")
    p.add_argument("dest", help="FILE.zip or an fsspec URL ending in .zip")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("verify", help="check an export's checksums and schema version")
    p.add_argument("file")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("import", help="verify an export and place it under results/")
    p.add_argument("file")
    p.add_argument("--results-dir", default="results", help="where to place the sweep (default: results)")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("merge", help="merge exports of compatible sweeps (union of points)")
    p.add_argument("files", nargs="+", help="two or more export files")
    p.add_argument("--out", required=True, help="the merged export (.zip)")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("simulate-shard", help="(workflow) simulate one shard's missing points")
    p.add_argument("spec")
    p.add_argument("--receipt", required=True)
    p.add_argument("--execution", required=True)
    p.add_argument("--cluster-dir", required=True)
    p.add_argument("--log")
    p.set_defaults(func=cmd_simulate_shard)

    p = sub.add_parser("aggregate", help="(workflow) build ensemble.zarr from the point stores")
    p.add_argument("sweep_spec")
    p.add_argument("--out", required=True)
    p.add_argument("--release-cluster", metavar="CLUSTER_DIR",
                   help="stop the run's shared local Dask cluster kept in CLUSTER_DIR (all shards are done)")
    p.add_argument("--log")
    p.set_defaults(func=cmd_aggregate)

    p = sub.add_parser("fit", help="(workflow) fit scaling laws to an ensemble")
    p.add_argument("ensemble")
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--log")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("report", help="(workflow) write the HTML report")
    p.add_argument("--ensemble", required=True)
    p.add_argument("--fits", required=True)
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--figures", help="also write every figure as <name>.png into this directory")
    p.add_argument("--jobs", type=_positive_int, default=1, help="processes drawing the figures (default 1)")
    p.add_argument("--log")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("cluster-daemon", help="(internal) serve a workflow run's local Dask cluster")
    p.add_argument("--state", required=True)
    p.add_argument("--workers", type=_positive_int, required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.set_defaults(func=cmd_cluster_daemon)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:  # everything after -- goes to snakemake untouched
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    if extra and args.command != "run":
        build_parser().error("arguments after -- are only accepted by 'sgdsweep run'")
    args.snakemake_args = extra
    _setup_logging(getattr(args, "log", None))
    try:
        return int(args.func(args) or 0)
    except SgdsweepError as exc:
        print(f"sgdsweep: error: {exc}", file=sys.stderr)
        return exc.exit_code
