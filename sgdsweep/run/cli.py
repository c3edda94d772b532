"""The ``sgdsweep`` command.

User verbs: ``run`` (validate, then run the Snakemake workflow), ``validate``, ``plan``, and the
sharing verbs ``export``, ``verify``, ``import``, ``merge``. Workflow verbs (called by the rules in
``workflow/rules/``, hidden from the top-level help): ``simulate-shard``, ``aggregate``, ``fit``,
``report``; ``cluster-daemon`` runs the local Dask cluster that ``sgdsweep run`` owns for its run.

Exit codes: :data:`EXIT_CODES`.

Terminal output: ``-q`` leaves errors, warnings and the result; ``-v`` adds debugging detail and,
for ``run``, Snakemake's own output (:mod:`sgdsweep.run.runner`). After Ctrl-C only ``sgdsweep
run`` says so (its jobs exit 130 silently). A reader that closes the output early (``sgdsweep plan
CONFIG | head``) ends the command quietly with exit status 141, as it ends Unix tools.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
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
    141: "the output's reader closed it early (e.g. '| head'); the command stopped quietly",
}

#: Exit status when the output's reader went away: 128 + SIGPIPE, as for a Unix tool that SIGPIPE ended.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE

#: The verbs the workflow's rules run (not listed in the top-level help).
WORKFLOW_VERBS = ("simulate-shard", "aggregate", "fit", "report", "cluster-daemon", "job-server")


def _verbosity(args: argparse.Namespace) -> int:
    """-1, 0 or 1 from ``-q``/``-v``; without either, what the parent ``sgdsweep run`` passed on."""
    flags = getattr(args, "verbose", 0) - getattr(args, "quiet", 0)
    return max(-1, min(1, flags)) if flags else verbosity()


def _setup_logging(log_file: str | None, verbosity: int = 0) -> None:
    """Log to stderr at the level ``verbosity`` asks for, and at INFO (DEBUG with -v) to ``log_file``."""
    terminal = logging.StreamHandler(sys.stderr)
    terminal.setLevel({-1: logging.WARNING, 0: logging.INFO, 1: logging.DEBUG}[verbosity])
    handlers: list[logging.Handler] = [terminal]
    if log_file:  # created afresh: a symbolic link planted there is removed, not written through
        from sgdsweep.run.locking import create_afresh

        handlers.append(logging.StreamHandler(create_afresh(Path(log_file), "w")))
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


def _read_spec(path: str) -> dict:
    """A job's plan file (:func:`sgdsweep.sweep.plan.read_plan_file`: one named by content must
    hold what its name says), parsed."""
    from sgdsweep.sweep.plan import read_plan_file

    try:
        return json.loads(read_plan_file(path))
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
    _warn_short_burn_in(sweep)
    return 0


def _warn_short_burn_in(sweep) -> None:
    """Print the sweep's warning of burn-ins too short for the stationary state, if any
    (:mod:`sgdsweep.sweep.burn_in`)."""
    from sgdsweep.sweep.burn_in import short_burn_in_warning

    warning = short_burn_in_warning(sweep)
    if warning:
        print(warning)


def cmd_plan(args: argparse.Namespace) -> int:
    from sgdsweep.sweep.config import load_sweep
    from sgdsweep.sweep.explain import explain, format_explanation

    sweep = load_sweep(args.config)
    print(format_explanation(sweep, explain(sweep), verbose=not args.summary, cost=not args.summary))
    _warn_short_burn_in(sweep)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from sgdsweep.run.runner import run_sweep

    return run_sweep(args, _verbosity(args))


def cmd_simulate_shard(args: argparse.Namespace) -> int:
    from sgdsweep.run.execute import run_shard
    from sgdsweep.sweep.execution import worker_count

    execution = _read_json(args.execution)
    if args.threads is not None:  # the cores Snakemake gave the job: its own cluster takes no more
        execution = {**execution, "workers": max(1, min(worker_count(execution), args.threads))}
    run_shard(Path(args.spec), Path(args.receipt), execution)
    return 0


def cmd_aggregate(args: argparse.Namespace) -> int:
    from sgdsweep.store.aggregate_incremental import update_ensemble

    spec = _read_spec(args.sweep_spec)
    if args.receipt:  # the receipt says the ensemble is current: not while it is being changed
        Path(args.receipt).unlink(missing_ok=True)
    with heartbeat("aggregate: reading the point stores and writing the ensemble"):
        n, how = update_ensemble(spec, args.out)
    if args.receipt:  # the workflow's job: fits and report of other points are no longer current
        from sgdsweep.core.identity import points_digest
        from sgdsweep.core.paths import atomic_write_text
        from sgdsweep.sweep.plan import PlanFiles, remove_stale_results

        files = PlanFiles(Path(args.out).parent)
        if files.ensemble == Path(args.out):
            for path in remove_stale_results(files, points_digest(e["hash"] for e in spec["points"])):
                log.info("removed %s: made from the points of an earlier ensemble", path)
        atomic_write_text(args.receipt, json.dumps({"ensemble": str(args.out), "points": len(spec["points"]),
                                                    "sweep_hash": spec.get("sweep_hash")}) + "\n")
    log.info("ensemble with %d points written to %s (%s)", n, args.out, how)
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from sgdsweep.analysis.fit import fit_ensemble
    from sgdsweep.analysis.fit.cache import FitCache
    from sgdsweep.core.identity import content_hash
    from sgdsweep.core.paths import atomic_write_text
    from sgdsweep.sweep.precision import fit_archive_name

    spec = _read_spec(args.spec)
    cache = FitCache(args.fit_cache) if args.fit_cache else None
    with heartbeat("fit: bootstrapping the fits"):
        fits = fit_ensemble(_read_ensemble(args.ensemble), spec, cache)
    if cache is not None:
        cache.save()
        log.info("fit: %d group fit(s) made, %d unchanged since the previous fits taken from %s",
                 cache.made, cache.reused, args.fit_cache)
    fits["settings"]["spec_hash"] = content_hash(spec)
    atomic_write_text(args.out, json.dumps(fits, indent=1) + "\n")
    if args.archive and fits["settings"].get("points_digest"):  # named by what it was made from, for later rounds
        Path(args.archive).mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(args.archive) / fit_archive_name(fits["settings"]), json.dumps(fits) + "\n")
    for kind, results in fits.items():
        if not isinstance(results, list):  # "skipped", "settings" and other records, not fits
            continue
        for res in results:
            for name, q in (res.get("params") or {}).items():
                if q and q.get("estimate") is not None:
                    log.info("%s", fit_line(kind, name, res.get("group"), q))
    for kind, why in fits.get("skipped", {}).items():
        log.info("fit %s not run: %s", kind, why)
    return 0


def fit_line(kind: str, name: str, group: dict[str, Any] | None, q: dict[str, Any]) -> str:
    """One fitted parameter as ``sgdsweep fit`` logs it, numbers to 5 significant digits:
    ``fit power_law a at hidden_width = 2 = 1.0986 [1.05, 1.1472] (bootstrap; theory 1.0896, inside)``."""
    from sgdsweep.analysis.fit.verdict import num, where

    lo, hi = (num(v, 5) for v in q["interval"])
    theory = (f"theory {num(q['theory'], 5)}, {'inside' if q.get('theory_inside') else 'outside'}"
              if q.get("theory") is not None else "no theory")
    at = f" at {where(group)}" if group else ""
    return f"fit {kind} {name}{at} = {num(q['estimate'], 5)} [{lo}, {hi}] ({q['interval_method']}; {theory})"


def cmd_report(args: argparse.Namespace) -> int:
    from sgdsweep.analysis.report import build_report, figure_pool

    pool = figure_pool(args.jobs)  # the workers boot while this process reads its inputs
    try:
        from sgdsweep.core.paths import atomic_write_text

        with heartbeat("report: drawing the figures"):
            text = build_report(_read_ensemble(args.ensemble), _read_json(args.fits), _read_spec(args.spec),
                                figures_dir=args.figures, pool=pool, figure_cache=args.figure_cache)
    finally:
        if pool is not None:
            pool.shutdown()
    atomic_write_text(args.out, text)
    log.info("report written to %s", args.out)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from sgdsweep.share.archive import export_sweep

    if args.format == "netcdf":  # the ensemble alone, for netCDF tools (sgdsweep.store.netcdf)
        from sgdsweep.store.netcdf import export_netcdf

        path = export_netcdf(args.sweep_dir, args.dest)
        print(f"exported the ensemble of {args.sweep_dir} to the netCDF-4 file {path}")
        return 0

    manifest = export_sweep(args.sweep_dir, args.dest, license_id=args.license, fmt=args.format)
    print(f"exported sweep '{manifest['sweep']}' ({len(manifest['points'])} points, "
          f"{len(manifest['members'])} members) to {args.dest}"
          + (" (a directory: publish it on any web server)" if args.format == "directory" else ""))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from sgdsweep.share.archive import verify

    manifest = verify(args.file)
    print(f"{args.file}: OK — sweep '{manifest['sweep']}', {len(manifest['points'])} points, "
          f"{len(manifest['members'])} members match their SHA-256, schema {manifest['schema_version']}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from sgdsweep.share.archive import import_sweep

    target = import_sweep(args.file, args.results_dir)
    print(f"imported into {target}/; re-run fits and report without simulating: "
          f"sgdsweep run {target}/config.yaml")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from sgdsweep.share.archive import merge_exports

    manifest = merge_exports(args.files, args.out)
    print(f"merged {len(args.files)} exports into {args.out}: {len(manifest['points'])} points")
    return 0


def cmd_cluster_daemon(args: argparse.Namespace) -> int:
    from sgdsweep.run.cluster import serve

    serve(Path(args.dir), args.workers, args.host, args.gpus, args.owner)
    return 0


def cmd_job_server(args: argparse.Namespace) -> int:
    from sgdsweep.run.jobserver import become, serve

    job = serve(Path(args.socket), args.owner)
    if job is None:  # the server, once it has stopped: nothing of it to flush but its log
        logging.shutdown()
        os._exit(0)  # without tearing down the modules it imported (~1 s)
    become(job)  # a forked child: the job's streams, directory and environment; then the job itself
    return main(job.argv)


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
    def output(run: bool) -> argparse.ArgumentParser:
        """The -q/-v options, told for ``run`` or for the other verbs."""
        parent = argparse.ArgumentParser(add_help=False)
        group = parent.add_argument_group("output")
        group.add_argument("-q", "--quiet", action="count", default=0,
                           help="print only errors, warnings and the closing summary" if run
                           else "print only errors, warnings and the result")
        group.add_argument("-v", "--verbose", action="count", default=0,
                           help="also print debugging detail, Snakemake's own output and its shell commands" if run
                           else "also print debugging detail")
        return parent

    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="sgdsweep", description=_DESCRIPTION, epilog=_epilog(),
                                     formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def verb(name: str, help: str | None, usage: str | None = None) -> argparse.ArgumentParser:
        """A subcommand; without ``help`` it is not listed in the top-level help."""
        kwargs = {"help": help} if help else {}
        codes = tuple(EXIT_CODES) if name == "run" else (0, 1, 2, EXIT_BROKEN_PIPE)  # only a run takes the lock
        return sub.add_parser(name, description=help, usage=usage, parents=[output(name == "run")],
                              epilog=_epilog(codes),
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
    p.add_argument("dest", help="the export to write: FILE.zip or an fsspec URL ending in .zip, or with --format "
                   "directory a new directory (must not exist)")
    p.add_argument("--format", choices=("zip", "directory", "netcdf"), default="zip",
                   help="zip: one verifiable file (default); directory: the same files unzipped, a Zarr group "
                   "with consolidated metadata that any static web server can publish; netcdf: the ensemble "
                   "alone as one netCDF-4 file FILE.nc (CF-1.11) for netCDF tools")
    p.add_argument("--license", default=None, metavar="SPDX",
                   help="the licence the export's RO-Crate declares (default: the config's metadata.license, "
                   "else CC-BY-4.0)")
    p.set_defaults(func=cmd_export)

    p = verb("verify", "check an export's checksums, manifest and schema version")
    p.add_argument("file", help="an export written by 'sgdsweep export' or 'sgdsweep merge': a .zip file or its "
                   "URL (https://…/SWEEP.zip, read in place through range requests)")
    p.set_defaults(func=cmd_verify)

    p = verb("import", "verify an export and place it under results/")
    p.add_argument("file", help="an export written by 'sgdsweep export' or 'sgdsweep merge': a .zip file or its "
                   "URL (https://…/SWEEP.zip, read in place through range requests)")
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
    p.add_argument("--threads", type=_positive_int, metavar="N",
                   help="the cores of this job (rule simulate's threads): a cluster this job starts has at "
                        "most N workers (execution.workers, auto: the cores this process may use)")
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
    p.add_argument("--fit-cache", help="take the fits of groups whose points and settings have not changed since "
                   "the previous fits made with this directory from it, and keep this job's there")
    p.add_argument("--log", help="also log to this file")
    p.set_defaults(func=cmd_fit)

    p = verb("report", None)
    p.add_argument("--ensemble", required=True, help="the ensemble (ensemble.zarr)")
    p.add_argument("--fits", required=True, help="the fit results (fits.json)")
    p.add_argument("--spec", required=True, help="the report settings, <sweep>/plan/report.json")
    p.add_argument("--out", required=True, help="the HTML report to write")
    p.add_argument("--figures", help="also write every figure as <name>.png into this directory")
    p.add_argument("--jobs", type=_positive_int, default=1, help="processes drawing the figures (default 1)")
    p.add_argument("--figure-cache", help="take figures whose inputs have not changed since the previous report "
                   "built with this directory from it, and keep this report's figures there")
    p.add_argument("--log", help="also log to this file")
    p.set_defaults(func=cmd_report)

    p = verb("cluster-daemon", None)
    p.add_argument("--dir", required=True,
                   help="where to write the Dask scheduler file, the record of a failure and the log")
    p.add_argument("--workers", type=int, required=True, help="CPU worker processes (0 with --gpus)")
    p.add_argument("--gpus", type=int, default=0, help="GPU worker processes, one per GPU (default 0)")
    p.add_argument("--host", default="127.0.0.1", help="the interface to bind (default 127.0.0.1)")
    p.add_argument("--owner", type=int, help="the pid of the parent process whose end stops the cluster "
                                             "(default: the parent process at the start)")
    p.set_defaults(func=cmd_cluster_daemon)

    p = verb("job-server", None)
    p.add_argument("--socket", required=True, help="where to listen for the run's jobs (a Unix socket)")
    p.add_argument("--owner", type=int, required=True, help="the pid of the process whose end stops the server")
    p.set_defaults(func=cmd_job_server)
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
    try:
        _setup_logging(getattr(args, "log", None), _verbosity(args))
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, not at exit: a reader that went away (| head) is met below
        return code
    except SgdsweepError as exc:
        print(f"sgdsweep: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        if args.command in WORKFLOW_VERBS and VERBOSITY_ENV in os.environ:
            return 130  # a job of `sgdsweep run`, which says it once for the whole run
        print("sgdsweep: interrupted (run the same command again to resume)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE


def _discard_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered for a reader that went away is dropped at
    exit instead of raising BrokenPipeError again (Python's advice for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a file descriptor (a test's capture)
        pass
