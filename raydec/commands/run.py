"""``raydec run CONFIG``: a batch job (text-to-image or captioning) from its YAML config, on the
cluster in RAY_ADDRESS or a local one. The same as ``python jobs/<task>_batch.py --config
CONFIG``; re-running resumes (rows already written are skipped).

RAY_ADDRESS takes each form a cluster has: ``host:6379`` and ``ray://host:10001`` join it from
here; the dashboard's ``http://host:8265`` runs this command there as a Ray job, in a copy of this
folder, and prints its logs (``raydec.runtime.submit``)."""

from __future__ import annotations

import argparse
import os

import yaml


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raydec run", description=__doc__.splitlines()[0],
                                     epilog="Config fields: docs/configuration.md (JobConfig). Examples: jobs/configs/.")
    parser.add_argument("config", help="a JobConfig YAML file (task: t2i or caption)")
    parser.add_argument("--input", help="override input.path")
    parser.add_argument("--output", help="override output.path")
    parser.add_argument("--max-rows", help="decode at most this many rows in this run (a trial run; re-run to finish)")
    args = parser.parse_args(argv)
    try:
        with open(args.config) as stream:
            raw = yaml.safe_load(stream) or {}
    except OSError as error:
        raise SystemExit(f"raydec run: cannot read {args.config}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise SystemExit(f"raydec run: {args.config} is not YAML: {error}") from None
    task = raw.get("task", "t2i") if isinstance(raw, dict) else "t2i"
    overrides = [f for name in ("input", "output", "max_rows") if getattr(args, name) is not None
                 for f in (f"--{name.replace('_', '-')}", getattr(args, name))]
    from raydec.runtime.submit import in_working_dir, is_dashboard_address, submit_command  # lazy: keeps raydec run --help light

    address = os.environ.get("RAY_ADDRESS")
    if is_dashboard_address(address):  # its schema checked here; its paths are the cluster's, checked there
        from raydec.runtime.config import JobConfig  # lazy: keeps raydec run --help light

        JobConfig.from_yaml(args.config)
        return submit_command(address, ["run", in_working_dir(args.config, "config"), *overrides])
    from raydec.runtime.entrypoint import job_main  # lazy: keeps raydec run --help light

    rest = ["--config", args.config] + overrides
    return job_main(task if task in ("t2i", "caption") else "t2i", f"raydec run: a {task} batch job", rest)
