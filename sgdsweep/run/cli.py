"""The ``sgdsweep`` command.

User verbs: ``run`` (validate, then run the Snakemake workflow), ``validate``, ``plan``, and the
sharing verbs ``export``, ``verify``, ``import``, ``merge``. Workflow verbs (called by the rules in
``workflow/rules/``, hidden from the top-level help): ``simulate-shard``, ``aggregate``, ``fit``,
``report``; ``cluster-daemon`` runs the local Dask cluster that ``sgdsweep run`` owns for its run.

Exit codes: :data:`EXIT_CODES`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sgdsweep.errors import SgdsweepError, UsageError
from sgdsweep.run.progress import VERBOSITY_ENV, heartbeat, verbosity

log = logging.getLogger("sgdsweep")

#: What each exit status of ``sgdsweep`` means (shown by ``sgdsweep --help``).
EXIT_CODES = {
    0: "success",
    1: "the run failed (a job, a fit or the cluster; the message says which and where its log is)",
    2: "bad input: the config, an argument, a file or the environment (the message names it)",
    3: "the sweep is in use by another sgdsweep run (wait for it or stop it)",
    130: "interrupted (Ctrl-C); the same command resumes",
}

def _verbosity(args: argparse.Namespace) -> int:
    """-1, 0 or 1 from ``-q``/``-v``; without either, what the parent ``sgdsweep run`` passed on."""
    flags = getattr(args, "verbose", 0) - getattr(args, "quiet", 0)
    return max(-1, min(1, flags)) if flags else verbosity()


def _setup_logging(log_file: str | None, verbosity: int = 0) -> None:
    """Log to stderr at the level ``verbosity`` asks for, and at INFO (DEBUG with -v) to ``log_file``."""
    terminal = logging.StreamHandler(sys.stderr)
    terminal.setLevel({-1: logging.WARNING, 0: logging.INFO, 1: logging.DEBUG}[verbosity])
    handlers: list[logging.Handler] = [terminal]
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, mode="w"))
    fmt = logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for h in handlers:
        h.setFormatter(fmt)
    root = logging.getLogger("sgdsweep")
    root.handlers[:] = handlers
    root.setLevel(logging.DEBUG if verbosity > 0 else logging.INFO)
    root.propagate = False


def _read_json(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"file not found: {path}") from None
    except ValueError as exc:
        raise UsageError(f"{path} is not valid JSON ({exc})") from None


def _read_ensemble(path: str):
    """The ensemble at ``path`` (:func:`sgdsweep.store.aggregate.load_ensemble`), or a
    :class:`UsageError` saying what is there instead."""
    import zarr

    from sgdsweep.store.aggregate import load_ensemble

    if not Path(path).exists():
        raise UsageError(f"ensemble not found: {path} (the aggregate step writes it: "
                         f"'sgdsweep aggregate SWEEP_SPEC --out {path}')")
    try:
        return load_ensemble(path)
    except zarr.errors.NodeNotFoundError:
        raise UsageError(f"{path} is not an ensemble: no Zarr group there (give the ensemble.zarr that "
                         "'sgdsweep aggregate' wrote)") from None


def cmd_validate(args: argparse.Namespace) -> int:
    from sgdsweep.sweep.config import load_sweep

    sweep = load_sweep(args.config)
    swept = [c for c in sweep.coords if len({p.params.get(c) for p in sweep.points}) > 1]
    print(f"{args.config}: valid. Sweep '{sweep.name}': {len(sweep.points)} points in "
          f"{len(sweep.shards)} shard(s); swept axes: {', '.join(swept) or 'none'}; "
          f"results in {sweep.directory}/")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from sgdsweep.sweep.config import load_sweep
    from sgdsweep.sweep.plan import explain, format_explanation

    sweep = load_sweep(args.config)
    print(format_explanation(sweep, explain(sweep), verbose=not args.summary, cost=not args.summary))
    return 0


def _snakefile() -> Path:
    from sgdsweep.sweep.paths import workflow_root

    return workflow_root() / "Snakefile"


def cmd_run(args: argparse.Namespace) -> int:
    import time

    from sgdsweep.run import locking
    from sgdsweep.run.cluster import scheduler_address
    from sgdsweep.store.points import complete_points
    from sgdsweep.sweep.config import load_sweep
    from sgdsweep.sweep.device import device_override, snakemake_config
    from sgdsweep.sweep.paths import write_if_changed
    from sgdsweep.sweep.plan import PlanFiles, explain, format_explanation, plan_texts

    t0 = time.monotonic()
    device = device_override(args.config, args.device, args.snakemake_args)  # --device: execution.device
    sweep = load_sweep(args.config, device)  # fail fast, with our message, before Snakemake starts
    scheduler_address(sweep.config["execution"])
    locking.ensure_writable(Path.cwd(), "the working directory, where Snakemake keeps its state (.snakemake),",
                            "or run sgdsweep from a writable directory")
    locking.ensure_writable(sweep.directory)
    # the sweep's lock before anything starts: a second run is refused here, before it starts
    # a Dask cluster; Snakemake inherits the lock (locking.acquire_or_inherit)
    lock = locking.acquire(sweep.directory)
    hashes = [p.hash for p in sweep.points]
    stored_before = complete_points(PlanFiles(sweep.directory).points_dir, hashes)
    todo = len(hashes) - len(stored_before)
    # the sweep lock excludes every other run of this sweep, so Snakemake's own directory lock is
    # not needed, and what a killed run left incomplete is rerun: no manual --unlock after kill -9
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(_snakefile()), "--configfile",
           str(args.config), *snakemake_config(args.device), "--cores", str(args.cores), "--nolock",
           "--rerun-incomplete"]
    if args.dry_run:
        cmd.append("--dry-run")
    verbosity = _verbosity(args)
    if verbosity < 0:
        cmd += ["--quiet", "progress", "rules", "host", "reason"]  # not "all": that hides errors too
    elif verbosity > 0:
        cmd.append("--printshellcmds")
    cmd += args.snakemake_args
    log.info("sweep '%s': %d points, %d stored, %d to simulate; results in %s/", sweep.name, len(hashes),
             len(stored_before), todo, sweep.directory)
    reasons = explain(sweep)  # before the plan is rewritten: it compares with the previous one
    plan = {} if args.dry_run else plan_texts(sweep)  # a sweep beyond max_memory fails here
    log.debug("running %s", " ".join(cmd))
    env = {**os.environ, locking.LOCK_FD_ENV: str(lock.fileno()), VERBOSITY_ENV: str(verbosity)}
    env.update(_job_environment())
    # only for a plain local run: extra Snakemake arguments (a profile, an executor, a dry run, a
    # target) may mean jobs elsewhere or none; then each shard job uses a cluster of its own
    plain = not args.dry_run and not args.snakemake_args and not os.environ.get("SNAKEMAKE_PROFILE")
    with lock, _run_cluster(sweep, env, start=bool(todo) and plain):
        # a sweep with precision targets or an edge search runs one Snakemake per round, until
        # a round leaves nothing to simulate and the report shows the last round (no plan file
        # changes); any other sweep runs once
        for _ in range(_max_rounds(sweep) + 2):
            if verbosity >= 0:
                print(format_explanation(sweep, reasons, max_lines=20), file=sys.stderr)
            # the plan on disk is this config's whatever Snakemake's records hold (none in another
            # working directory); the plan rules then rewrite a file only when its content changed
            for path, text in plan.items():
                write_if_changed(path, text)
            code = _snakemake(cmd, lock, env, sweep)
            if code != 0 or args.dry_run or not sweep.rounds:
                break
            sweep = load_sweep(args.config, device)  # the next round, decided from what this one stored
            reasons = explain(sweep)
            plan = plan_texts(sweep)
            if not any(_differs(path, text) for path, text in plan.items()):
                break
    if code < 0:  # Snakemake was killed: a run of the same command resumes where it stopped
        raise SgdsweepError(f"Snakemake was killed by signal {-code}; run the same command again to resume "
                            f"(stored points are kept, and only what is missing is computed)")
    if code == 0 and not args.dry_run:
        from sgdsweep.run.summary import run_summary

        print(run_summary(sweep, stored_before, time.monotonic() - t0), file=sys.stderr)
    return code


def _snakemake(cmd: list[str], lock: Any, env: dict[str, str], sweep: Any) -> int:
    """Run Snakemake (``cmd``) under the sweep's ``lock`` and return its exit status."""
    from sgdsweep.run import locking

    with subprocess.Popen(cmd, pass_fds=(lock.fileno(),), env=env) as proc:
        locking.record_holder(Path(sweep.directory) / locking.LOCK_NAME, proc.pid)
        try:
            return proc.wait()
        except KeyboardInterrupt:  # Snakemake got the same Ctrl-C: let it stop its jobs first
            proc.wait()
            raise


def _max_rounds(sweep: Any) -> int:
    """Most rounds a sweep may run (0 without precision or search)."""
    cfg = sweep.config
    if "precision" in cfg:
        return int(cfg["precision"]["budget"]["max_rounds"])
    if "search" in cfg:
        return int(cfg["search"]["max_rounds"])
    return 0


def _differs(path: Path, text: str) -> bool:
    try:
        return path.read_text() != text
    except OSError:
        return True


def _job_environment() -> dict[str, str]:
    """PATH and PYTHONPATH for the Snakemake process of ``sgdsweep run`` and its jobs: ``python``
    is this interpreter, and ``sgdsweep`` this package, installed or not."""
    package_root = str(Path(__file__).resolve().parents[2])
    return {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONPATH": package_root + os.pathsep + os.environ.get("PYTHONPATH", "")}


@contextlib.contextmanager
def _run_cluster(sweep: Any, env: dict[str, str], start: bool) -> Iterator[None]:
    """The run's local Dask cluster for the block, when ``start`` and the sweep's shard jobs would
    use a local one (:mod:`sgdsweep.run.cluster`): started first (its workers boot while Snakemake
    builds the DAG), named to the jobs through the scheduler file's path in ``env``, and stopped
    when the block ends in any way."""
    from sgdsweep.run.cluster import (
        SCHEDULER_FILE,
        SCHEDULER_FILE_ENV,
        start_run_cluster,
        stop_run_cluster,
        uses_local_cluster,
        worker_count,
    )
    from sgdsweep.sweep.plan import PlanFiles

    execution = sweep.config["execution"]
    env.pop(SCHEDULER_FILE_ENV, None)  # a scheduler file of an enclosing run is not this run's
    if not (start and uses_local_cluster(execution)):
        yield
        return
    from sgdsweep.run.gpus import local_cpu_workers, local_gpus

    cluster_dir = PlanFiles(sweep.directory).cluster_dir
    workers, gpus = local_cpu_workers(execution, worker_count(execution)), local_gpus(execution)
    log.info("starting a local Dask cluster of %d workers; it first compiles the simulation kernels "
             "(the first run of an installation: 1-3 min on a busy 2-core machine; later runs load them "
             "from numba's cache in seconds)", workers + gpus)
    proc = start_run_cluster(cluster_dir, workers, execution.get("host", "127.0.0.1"), gpus)
    env[SCHEDULER_FILE_ENV] = str(cluster_dir / SCHEDULER_FILE)
    try:
        yield
    finally:
        stop_run_cluster(proc, cluster_dir)


def cmd_simulate_shard(args: argparse.Namespace) -> int:
    from sgdsweep.run.execute import run_shard

    run_shard(Path(args.spec), Path(args.receipt), _read_json(args.execution))
    return 0


def cmd_aggregate(args: argparse.Namespace) -> int:
    from sgdsweep.store.aggregate import build_ensemble, write_ensemble

    with heartbeat("aggregate: reading the point stores and writing the ensemble"):
        spec = _read_json(args.sweep_spec)
        ds = build_ensemble(spec)
        write_ensemble(ds, args.out)
    if args.receipt:
        from sgdsweep.sweep.paths import atomic_write_text

        atomic_write_text(args.receipt, json.dumps({"ensemble": str(args.out), "points": len(spec["points"]),
                                                    "sweep_hash": spec.get("sweep_hash")}) + "\n")
    log.info("ensemble with %d points written to %s", ds.sizes["point"], args.out)
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from sgdsweep.analysis.fit import fit_ensemble
    from sgdsweep.sweep.identity import content_hash
    from sgdsweep.sweep.paths import atomic_write_text
    from sgdsweep.sweep.precision import fit_archive_name

    spec = _read_json(args.spec)
    with heartbeat("fit: bootstrapping the fits"):
        fits = fit_ensemble(_read_ensemble(args.ensemble), spec)
    fits["settings"]["spec_hash"] = content_hash(spec)
    atomic_write_text(args.out, json.dumps(fits, indent=1) + "\n")
    if args.archive and fits["settings"].get("points_digest"):  # named by what it was made from, for later rounds
        Path(args.archive).mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(args.archive) / fit_archive_name(fits["settings"]), json.dumps(fits) + "\n")
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
    from sgdsweep.analysis.report import build_report, figure_pool

    pool = figure_pool(args.jobs)  # the workers boot while this process reads its inputs
    try:
        from sgdsweep.sweep.paths import atomic_write_text

        with heartbeat("report: drawing the figures"):
            text = build_report(_read_ensemble(args.ensemble), _read_json(args.fits), _read_json(args.spec),
                                figures_dir=args.figures, pool=pool)
    finally:
        if pool is not None:
            pool.shutdown()
    atomic_write_text(args.out, text)
    log.info("report written to %s", args.out)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from sgdsweep.store.share import export_sweep

    manifest = export_sweep(args.sweep_dir, args.dest)
    print(f"exported sweep '{manifest['sweep']}' ({len(manifest['points'])} points, "
          f"{len(manifest['members'])} members) to {args.dest}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from sgdsweep.store.share import verify

    manifest = verify(args.file)
    print(f"{args.file}: OK — sweep '{manifest['sweep']}', {len(manifest['points'])} points, "
          f"{len(manifest['members'])} members match their SHA-256, schema {manifest['schema_version']}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from sgdsweep.store.share import import_sweep

    target = import_sweep(args.file, args.results_dir)
    print(f"imported into {target}/; re-run fits and report without simulating: "
          f"sgdsweep run {target}/config.yaml")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from sgdsweep.store.share import merge_exports

    manifest = merge_exports(args.files, args.out)
    print(f"merged {len(args.files)} exports into {args.out}: {len(manifest['points'])} points")
    return 0


def cmd_cluster_daemon(args: argparse.Namespace) -> int:
    from sgdsweep.run.cluster import serve

    serve(Path(args.dir), args.workers, args.host, args.gpus)
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


_DESCRIPTION = """\
Parameter sweeps of stochastic gradient descent on models with known physics: a YAML config
names a grid over lr, batch_size, momentum, samples_per_param, hidden_width and noise; Snakemake
runs it on Dask, stores the ensemble in Zarr with the exact theory beside each measurement, fits
the scaling laws and writes an HTML report.

Start with:  sgdsweep run config/config.yaml --cores 2"""


def _epilog(codes: tuple[int, ...] = tuple(EXIT_CODES)) -> str:
    codes = "\n".join(f"  {code}  {EXIT_CODES[code]}" for code in codes)
    return f"exit status:\n{codes}\n\nsgdsweep COMMAND --help shows a command's arguments."


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sgdsweep")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree that is not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser; the workflow's own verbs are hidden from the top-level help."""
    output = argparse.ArgumentParser(add_help=False)
    group = output.add_argument_group("output")
    group.add_argument("-q", "--quiet", action="count", default=0,
                       help="print only warnings and errors (run: and its closing summary)")
    group.add_argument("-v", "--verbose", action="count", default=0,
                       help="print debugging detail (run: and Snakemake's shell commands)")
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="sgdsweep", description=_DESCRIPTION, epilog=_epilog(),
                                     formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def verb(name: str, help: str | None, usage: str | None = None) -> argparse.ArgumentParser:
        """A subcommand; without ``help`` it is not listed in the top-level help."""
        kwargs = {"help": help} if help else {}
        codes = tuple(EXIT_CODES) if name == "run" else (0, 1, 2)  # only a run takes the sweep's lock
        return sub.add_parser(name, description=help, usage=usage, parents=[output], epilog=_epilog(codes),
                              formatter_class=fmt, **kwargs)

    p = verb("run", "validate a config and run its sweep through Snakemake",
             usage="sgdsweep run [CONFIG] [--cores N] [-n] [-q|-v] [-- SNAKEMAKE ARGUMENTS]")
    p.add_argument("config", nargs="?", default="config/config.yaml",
                   help="the sweep config, a YAML file (default: config/config.yaml)")
    p.add_argument("--cores", type=_positive_int, default=os.cpu_count() or 1,
                   help="CPU cores Snakemake may use for its jobs (default: all of this machine's)")
    p.add_argument("-n", "--dry-run", action="store_true", help="only show what would run")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"),
                   help="where the shards simulate, overriding the config's execution.device (docs/gpu.md)")
    p.set_defaults(func=cmd_run)

    p = verb("validate", "check a config and print its size")
    p.add_argument("config", help="the sweep config to check, a YAML file")
    p.set_defaults(func=cmd_validate)

    p = verb("plan", "list the points a run would simulate, and why")
    p.add_argument("config", help="the sweep config, a YAML file")
    p.add_argument("-s", "--summary", action="store_true", help="only the counts, not one line per point")
    p.set_defaults(func=cmd_plan)

    p = verb("export", "write a finished sweep to one verifiable zip file (path or fsspec URL)")
    p.add_argument("sweep_dir", help="the sweep's results directory, results/<sweep>")
    p.add_argument("dest", help="the export to write: FILE.zip or an fsspec URL ending in .zip (must not exist)")
    p.set_defaults(func=cmd_export)

    p = verb("verify", "check an export's checksums, manifest and schema version")
    p.add_argument("file", help="an export written by 'sgdsweep export' or 'sgdsweep merge' (.zip)")
    p.set_defaults(func=cmd_verify)

    p = verb("import", "verify an export and place it under results/")
    p.add_argument("file", help="an export written by 'sgdsweep export' or 'sgdsweep merge' (.zip)")
    p.add_argument("--results-dir", default="results", help="where to place the sweep (default: results)")
    p.set_defaults(func=cmd_import)

    p = verb("merge", "merge exports of compatible sweeps (union of points)")
    p.add_argument("files", nargs="+", help="two or more export files")
    p.add_argument("--out", required=True, help="the merged export to write (.zip, must not exist)")
    p.set_defaults(func=cmd_merge)

    # the workflow's own verbs: run by the rules in workflow/rules/, not listed in the top-level help
    p = verb("simulate-shard", None)
    p.add_argument("spec", help="the shard's plan file, <sweep>/plan/shards/<shard>.json")
    p.add_argument("--receipt", required=True, help="the shard's receipt to write (JSON)")
    p.add_argument("--execution", required=True, help="the run's execution settings, plan/execution.json")
    p.add_argument("--log", help="also log to this file")
    p.set_defaults(func=cmd_simulate_shard)

    p = verb("aggregate", None)
    p.add_argument("sweep_spec", help="the sweep's plan file, <sweep>/plan/sweep.json")
    p.add_argument("--out", required=True, help="the ensemble to write (a .zarr directory)")
    p.add_argument("--receipt", help="then write this JSON file naming it (the workflow's output)")
    p.add_argument("--log", help="also log to this file")
    p.set_defaults(func=cmd_aggregate)

    p = verb("fit", None)
    p.add_argument("ensemble", help="the ensemble (ensemble.zarr) to fit")
    p.add_argument("--spec", required=True, help="the fit settings, <sweep>/plan/fit.json")
    p.add_argument("--out", required=True, help="the fit results to write (fits.json)")
    p.add_argument("--archive", help="also keep them in DIR, named by their points and fit settings "
                   "(sweeps with precision.fits)")
    p.add_argument("--log", help="also log to this file")
    p.set_defaults(func=cmd_fit)

    p = verb("report", None)
    p.add_argument("--ensemble", required=True, help="the ensemble (ensemble.zarr)")
    p.add_argument("--fits", required=True, help="the fit results (fits.json)")
    p.add_argument("--spec", required=True, help="the report settings, <sweep>/plan/report.json")
    p.add_argument("--out", required=True, help="the HTML report to write")
    p.add_argument("--figures", help="also write every figure as <name>.png into this directory")
    p.add_argument("--jobs", type=_positive_int, default=1, help="processes drawing the figures (default 1)")
    p.add_argument("--log", help="also log to this file")
    p.set_defaults(func=cmd_report)

    p = verb("cluster-daemon", None)
    p.add_argument("--dir", required=True,
                   help="where to write the Dask scheduler file, the status record and the log")
    p.add_argument("--workers", type=int, required=True, help="CPU worker processes (0 with --gpus)")
    p.add_argument("--gpus", type=int, default=0, help="GPU worker processes, one per GPU (default 0)")
    p.add_argument("--host", default="127.0.0.1", help="the interface to bind (default 127.0.0.1)")
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
    _setup_logging(getattr(args, "log", None), _verbosity(args))
    try:
        return int(args.func(args) or 0)
    except SgdsweepError as exc:
        print(f"sgdsweep: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("sgdsweep: interrupted (run the same command again to resume)", file=sys.stderr)
        return 130
