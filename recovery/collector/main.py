"""An extra collector process (``python -m recovery.collector.main``); see collector_processes.

Runs the same collector threads as the worker (``start_collectors``) from the same settings (the
worker's environment) until SIGTERM or SIGINT, then stores and acks what it holds and exits. It
exits as well when the worker that started it is gone (``LAZARUS_COLLECTOR_PARENT``), which
``PR_SET_PDEATHSIG`` already covers on Linux; the check is for the moment between fork and
``prctl`` and for other kernels.
"""

import logging
import os
import signal
import sys
import threading


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from recovery.collector.bootsteps import COLLECTOR_SWITCH_INTERVAL_S
    from recovery.collector.consumer import start_collectors, stop_collectors

    log = logging.getLogger("recovery.collector.consumer")  # Django's LOGGING set its handlers up
    parent = int(os.environ.get("LAZARUS_COLLECTOR_PARENT") or 0)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    sys.setswitchinterval(COLLECTOR_SWITCH_INTERVAL_S)
    stop_event, threads = start_collectors()
    log.info("collector process %d started: %s", os.getpid(), ", ".join(t.name for t in threads))
    while not stop.wait(1.0):
        if parent and os.getppid() != parent:
            break  # the worker is gone: what we hold goes back to the queue
    stop_collectors(stop_event, threads)


if __name__ == "__main__":
    main()
