"""The engine process of a model replica: ``python -m raydec.serve.engine_worker --fd N --model NAME``.

Its replica starts it with one end of a socket pair (``--fd``); the first message is the served
model and limits. It loads the model, takes a core of its own where the node has one to spare
(``engine_core``), answers ``Ready`` (or ``StartFailed``), then drives the scheduler from one
thread (``EngineLoop``) while the main thread reads the replica's messages.

It exits when the replica says ``Stop``, when the replica's end of the socket closes (the replica
process died: no engine outlives its replica), and when the engine loop dies (the replica then
starts a new engine).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any

#: the exit status of an engine whose loop died
LOOP_DIED = 70

logger = logging.getLogger("raydec.serve")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raydec.serve.engine_worker", description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="this process's end of the socket pair to its replica")
    parser.add_argument("--model", required=True, help="the served model's name (shown in process listings)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s %(name)s [engine of {args.model}, pid %(process)d] %(message)s")
    logging.getLogger("raydec").setLevel(logging.INFO)
    connection = Connection(args.fd)
    send_lock = threading.Lock()  # the engine thread sends events and replies; the main thread sends Ready

    def send(message: Any) -> None:
        with send_lock:
            try:
                connection.send(message)
            except OSError:  # the replica is gone: the main thread sees the closed socket and exits
                pass

    from raydec.serve.engine_core import CorePlacement, pin, take_cores
    from raydec.serve.engine_messages import Call, Cancel, StartFailed, Stop, Submit

    try:
        served, limits = connection.recv()
        from raydec.serve.engine_host import EngineHost  # torch and the model code load here, after the handshake began

        host = EngineHost(served, limits, send, on_death=lambda error: died(args.model, error))
        # once loaded and planned (a node's engines load side by side on all its cores), before the loop's thread starts:
        # every thread so far is pinned, and threads started later inherit the pinning and priority of their starter
        host.placement = pin(take_cores(served.torch_threads)) if served.engine_core else CorePlacement((), note="engine_core is false")
    except BaseException as error:  # the replica reports it and its constructor raises
        logger.error("the engine of model %s did not start:\n%s", args.model, traceback.format_exc())
        send(StartFailed(f"{type(error).__name__}: {error}"))
        return 1

    send(host.ready())
    host.start()
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):  # the replica process is gone
            os._exit(0)
        match message:
            case Submit():
                host.submit(message)
            case Cancel(rid):
                host.cancel(rid)
            case Call(cid, name):
                host.call(cid, name)
            case Stop():
                host.loop.stop()
                connection.close()
                os._exit(0)  # the engine thread may be inside a step: no interpreter shutdown waits for it


def died(model: str, error: BaseException) -> None:
    """The engine loop died (its rows were failed): the process exits, and its replica starts a new engine."""
    logger.error("the engine loop of model %s died (%s: %s); the engine process exits", model, type(error).__name__, error)
    os._exit(LOOP_DIED)


if __name__ == "__main__":
    sys.exit(main())
