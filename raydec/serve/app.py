"""Building the Serve application from a ``ServeConfig``: one deployment per served model and
the HTTP ingress in front of them.

    from raydec.serve import ServeConfig, build_app
    serve.run(build_app(ServeConfig.from_yaml("cluster/serve/reference.yaml")))

A Serve config file names ``import_path: raydec.serve:app_builder`` with the ServeConfig's
fields as ``args`` (``serve run`` / ``serve deploy``).
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve import Application

from raydec.serve.config import ServeConfig
from raydec.serve.ingress import Ingress
from raydec.serve.replica import replica_class


def deployment_name(model: str) -> str:
    """A served model's Serve deployment name."""
    return "model-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in model)


def build_app(config: ServeConfig) -> Application:
    """The raydec Serve application for ``config``."""
    models = {}
    for served in config.models:
        options: dict[str, Any] = {
            "name": deployment_name(served.name),
            "ray_actor_options": {"num_cpus": served.cpus_per_worker, "num_gpus": served.gpus_per_worker},
            "max_ongoing_requests": served.max_ongoing_requests,
            "max_queued_requests": served.max_queued_requests,
            "health_check_period_s": served.health_check_period_s,
            "health_check_timeout_s": served.health_check_timeout_s,
        }
        if served.autoscaling_config is not None:
            options["autoscaling_config"] = served.autoscaling_config
        else:
            options["num_replicas"] = served.num_replicas
        models[served.name] = serve.deployment(replica_class(served.task)).options(**options).bind(served, config.limits)
    ingress = serve.deployment(Ingress).options(
        name="ingress", num_replicas=config.ingress_replicas, max_ongoing_requests=config.ingress_max_ongoing_requests,
        ray_actor_options={"num_cpus": 0.1},
    )
    return ingress.bind(config, models)


def app_builder(args: dict[str, Any]) -> Application:
    """The builder a Serve config file's ``import_path`` names; ``args`` are ServeConfig's fields."""
    return build_app(ServeConfig.model_validate(dict(args)))
