"""The command line every batch job script shares: `python jobs/<task>_batch.py --config CONFIG`.

Validates the config, fails fast on inputs and outputs before any model loads, then runs
the Ray Data pipeline on the cluster this job belongs to (or a local one). Re-running the
same command resumes: rows already written are skipped.
"""

from __future__ import annotations

import argparse
import logging

from pydantic import ValidationError

from raydec.io import IOConfigError
from raydec.runtime.cluster import ClusterUnreachableError
from raydec.runtime.config import JobConfig
from raydec.runtime.pipeline import preflight, run_job
from raydec.validation import config_error_line, validation_problems


def job_main(task: str, description: str, argv: list[str] | None = None) -> int:
    """Parse ``--config`` (+ ``--input`` / ``--output`` overrides) and run a ``task`` job."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", required=True, help="YAML job file (see jobs/configs/)")
    parser.add_argument("--input", help="override input.path")
    parser.add_argument("--output", help="override output.path (relative paths land in the job's working dir)")
    parser.add_argument("--max-rows", type=int, help="decode at most this many rows in this run (a trial run)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # a bad config, input, output or model: one clear message, before Ray starts
        job = JobConfig.from_yaml(args.config)
        for section, path in (("input", args.input), ("output", args.output)):
            if path is not None:
                try:
                    getattr(job, section).path = path  # validated on assignment, as in the YAML
                except ValidationError as exc:
                    problems = "; ".join(f"{section}.{line}" for line in validation_problems(exc))
                    raise ValueError(f"--{section} {path!r}: {problems}") from None
        if args.max_rows is not None:
            try:
                job.max_rows = args.max_rows
            except ValidationError as exc:
                raise ValueError(f"--max-rows {args.max_rows}: {'; '.join(validation_problems(exc))}") from None
        if job.task != task:
            raise SystemExit(f"task: {job.task!r} in {args.config}; this entrypoint runs {task!r} jobs")
        files = preflight(job)
    except ValueError as exc:  # config, dataset, output, model and resume errors are ValueErrors
        raise SystemExit(config_error_line(args.config, exc)) from None
    try:
        report = run_job(job, files)  # it joins the cluster (connect_ray); the id scan runs there
    except (ClusterUnreachableError, IOConfigError) as exc:  # an unreachable cluster, a duplicate id: one line
        raise SystemExit(config_error_line(args.config, exc)) from None
    logging.getLogger(f"{task}_batch").info("done: %s", report)
    return 0
