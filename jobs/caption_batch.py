"""Captioning batch job: `ray job submit --working-dir . -- python jobs/caption_batch.py --config CONFIG`.

Validates the config, fails fast on inputs and outputs before any model loads, then runs
the Ray Data pipeline on the cluster this job belongs to (or a local one). Re-running the
same command resumes: rows already written are skipped.
"""

from __future__ import annotations

import argparse
import logging
import sys

from raydec.runtime import JobConfig, connect_ray, preflight, run_job


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="YAML job file (see jobs/configs/)")
    parser.add_argument("--input", help="override input.path")
    parser.add_argument("--output", help="override output.path (relative paths land in the job's working dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    job = JobConfig.from_yaml(args.config)
    if args.input:
        job.input = job.input.model_copy(update={"path": args.input})
    if args.output:
        job.output = job.output.model_copy(update={"path": args.output})
    if job.task != "caption":
        raise SystemExit(f"task: {job.task!r} in {args.config}; this entrypoint runs 'caption' jobs")
    files = preflight(job)
    connect_ray()
    report = run_job(job, files)
    logging.getLogger("caption_batch").info("done: %s", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
