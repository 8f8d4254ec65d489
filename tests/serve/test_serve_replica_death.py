"""A model replica's process killed under load: the requests it held end with an error (none
hangs), Serve starts a new replica, and later requests succeed. Runs last among the serving
tests (it restarts the text-to-image replica)."""

from __future__ import annotations

import os
import signal
import threading
import time

from tests.serve.helpers import call, stats


def test_killed_replica_fails_its_requests_and_is_replaced(serve_app):
    url, key = serve_app["url"], serve_app["key"]
    old_pid = stats(serve_app, "t2i")["pid"]
    results: list = []

    def one(i: int) -> None:
        started = time.monotonic()
        status, body, headers = call(url, "/v1/images/generations",
                                     {"prompt": f"a red square {i}", "model": "t2i", "seed": i, "method": "ar"}, key=key)
        results.append((status, body, headers, time.monotonic() - started))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while stats(serve_app, "t2i")["active_rows"] == 0:  # the batch is decoding
        assert time.monotonic() < deadline, "the requests never started decoding"
        time.sleep(0.05)
    os.kill(old_pid, signal.SIGKILL)
    for thread in threads:
        thread.join(90)
    assert not any(thread.is_alive() for thread in threads), "a request hung after its replica died"
    statuses = [status for status, _, _, _ in results]
    assert 503 in statuses and set(statuses) <= {200, 503}, statuses
    for status, body, headers, _ in results:
        if status == 503:
            assert body["error"]["code"] == "replica_unavailable" and int(headers["retry-after"]) >= 1

    deadline = time.monotonic() + 120
    while True:  # Serve replaces the replica; then requests succeed again
        status, body, _ = call(url, "/v1/images/generations", {"prompt": "a blue circle", "model": "t2i", "method": "ar"}, key=key)
        if status == 200:
            break
        assert status == 503 and time.monotonic() < deadline, (status, body)
        time.sleep(1)
    assert body["data"][0]["b64_json"]
    assert stats(serve_app, "t2i")["pid"] != old_pid
    assert call(url, "/health")[0] == 200
