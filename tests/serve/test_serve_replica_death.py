"""A model's engine process, then its replica's process, killed under load: the requests they held
end with a 503 (none hangs); the replica starts a new engine, or Serve a new replica, and later
requests succeed. Runs last among the serving tests (it restarts the text-to-image replica)."""

from __future__ import annotations

import os
import signal
import threading
import time

from raydec.serve.engine_core import cpu_quota
from tests.serve.helpers import call, stats
from tests.serve_process import running


def _kill_under_load(serve_app: dict, pid: int, what: str) -> None:
    """Six AR image requests; once their batch decodes, SIGKILL ``pid``: none hangs, and each answers 200 or 503."""
    url, key = serve_app["url"], serve_app["key"]
    results: list = []

    def one(i: int) -> None:
        results.append(call(url, "/v1/images/generations", {"prompt": f"a red square {i}", "model": "t2i", "seed": i, "method": "ar"},
                            key=key))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while stats(serve_app, "t2i").get("active_rows", 0) == 0:  # the batch is decoding
        assert time.monotonic() < deadline, "the requests never started decoding"
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    for thread in threads:
        thread.join(90)
    assert not any(thread.is_alive() for thread in threads), f"a request hung after its {what} died"
    _unavailable(results)


def _unavailable(results: list) -> None:
    statuses = [status for status, _, _ in results]
    assert 503 in statuses and set(statuses) <= {200, 503}, statuses
    for status, body, headers in results:
        if status == 503:
            assert body["error"]["code"] == "replica_unavailable" and int(headers["retry-after"]) >= 1


def test_killed_engine_fails_its_requests_and_the_replica_starts_a_new_one(serve_app):
    url, key = serve_app["url"], serve_app["key"]
    before = stats(serve_app, "t2i")
    _kill_under_load(serve_app, before["engine_pid"], "engine")
    deadline = time.monotonic() + 120
    while True:  # the replica starts a new engine; requests refused meanwhile get the same 503
        status, body, headers = call(url, "/v1/images/generations", {"prompt": "a blue circle", "model": "t2i", "method": "ar"},
                                     key=key)
        if status == 200:
            break
        _unavailable([(status, body, headers)])
        assert time.monotonic() < deadline, (status, body)
        time.sleep(0.5)
    after = stats(serve_app, "t2i")
    assert after["pid"] == before["pid"] and after["engine_pid"] not in (None, before["engine_pid"])
    assert after["engine_restarts"] == before["engine_restarts"] + 1
    assert call(url, "/health")[0] == 200
    # the new engine has a core of its own again (on a node with one to spare), pinned as its stats say
    cores, quota = len(os.sched_getaffinity(0)), cpu_quota()
    assert after["engine_cores"] or cores < 2 or (quota is not None and quota < cores)
    if after["engine_cores"]:
        assert sorted(os.sched_getaffinity(after["engine_pid"])) == after["engine_cores"]
        assert os.getpriority(os.PRIO_PROCESS, after["engine_pid"]) == after["engine_nice"]


def test_killed_replica_fails_its_requests_and_is_replaced(serve_app):
    url, key = serve_app["url"], serve_app["key"]
    before = stats(serve_app, "t2i")
    _kill_under_load(serve_app, before["pid"], "replica")
    deadline = time.monotonic() + 30
    while running(before["engine_pid"]):  # its engine saw the replica's end of the socket close, and exited
        assert time.monotonic() < deadline, "the engine process outlived its replica"
        time.sleep(0.1)

    deadline = time.monotonic() + 120
    while True:  # Serve replaces the replica; then requests succeed again
        status, body, _ = call(url, "/v1/images/generations", {"prompt": "a blue circle", "model": "t2i", "method": "ar"}, key=key)
        if status == 200:
            break
        assert status == 503 and time.monotonic() < deadline, (status, body)
        time.sleep(1)
    assert body["data"][0]["b64_json"]
    assert stats(serve_app, "t2i")["pid"] != before["pid"]
    assert call(url, "/health")[0] == 200

