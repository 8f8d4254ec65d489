"""``raydec serve --config cluster/serve/reference.yaml``: the OpenAI-compatible app on Ray Serve.

Joins the cluster in RAY_ADDRESS (``host:6379`` or ``ray://host:10001``; or starts a local one on
127.0.0.1), starts Serve's HTTP proxy on the config's host and port, deploys the app and waits
until it answers /health. With the dashboard's address (``http://host:8265``) the command runs on
the cluster as a Ray job, in a copy of this folder, and this process prints its logs until Ctrl-C
stops it (``raydec.runtime.submit``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request

from raydec.serve import ServeConfig
from raydec.serve.http_guard import proxy_environment

logger = logging.getLogger("raydec.serve")
APP_NAME = "raydec"


def start(config: ServeConfig, app_name: str = APP_NAME, ready_timeout_s: float = 600.0) -> str:
    """Deploy the app on the current Ray cluster (a local one if none) and wait until it is
    ready; returns its base URL."""
    import ray
    from ray import serve

    from raydec.runtime.cluster import connect_ray  # lazy, as the app: keeps raydec serve --help light
    from raydec.serve import build_app  # lazy: keeps raydec serve --help light

    connect_ray()
    # the proxies inherit the controller's environment: it gives them the head deadline (http_guard)
    serve.start(http_options={"host": config.host, "port": config.port},
                controller_options={"runtime_env": {"env_vars": proxy_environment(config.limits.header_timeout_s)}})
    serve.run(build_app(config), name=app_name, route_prefix=config.route_prefix, blocking=False)
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host
    url = f"http://{host}:{config.port}{config.route_prefix.rstrip('/')}"
    wait_ready(url, ready_timeout_s)
    logger.info("raydec is serving %s at %s (Ray %s)", ", ".join(m.name for m in config.models), url, ray.__version__)
    return url


def wait_ready(url: str, timeout_s: float) -> None:
    """Poll ``url``/health until it answers 200."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=10) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as error:
            last = f"HTTP {error.code}"
        except (urllib.error.URLError, OSError) as error:
            last = str(error)
        time.sleep(0.5)
    raise TimeoutError(f"the raydec app at {url} was not ready after {timeout_s:.0f} s (last: {last})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raydec serve", description="Serve OpenAI-compatible images and vision chat on Ray Serve.")
    parser.add_argument("--config", required=True, help="A ServeConfig YAML file (e.g. cluster/serve/reference.yaml).")
    parser.add_argument("--host", help="Override the config's host.")
    parser.add_argument("--port", type=int, help="Override the config's port.")
    parser.add_argument("--print-config", action="store_true", help="Print the validated config as JSON and exit.")
    args = parser.parse_args(argv)
    config = ServeConfig.from_yaml(args.config)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        config = config.model_copy(update=overrides)
    if args.print_config:
        print(json.dumps(config.model_dump(mode="json"), indent=2))
        return 0
    from raydec.runtime.submit import in_working_dir, is_dashboard_address, submit_command  # lazy: keeps --help light

    address = os.environ.get("RAY_ADDRESS")
    if is_dashboard_address(address):  # the dashboard takes jobs: this command runs there as one, until stopped
        flags = [f for name in ("host", "port") if getattr(args, name) is not None for f in (f"--{name}", str(getattr(args, name)))]
        return submit_command(address, ["serve", "--config", in_working_dir(args.config, "--config"), *flags])
    url = start(config)
    print(f"raydec: serving at {url} (Ctrl-C stops). Keys: {'required' if config.keys() else 'none'}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    from ray import serve

    serve.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
