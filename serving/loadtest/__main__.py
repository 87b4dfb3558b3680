"""The load-test process: Locust (gevent's monkey-patching) first, then everything else.

Started by `serving loadtest` with the parsed arguments in SERVING_LOADTEST_ARGS.
"""

import locust  # noqa: F401, I001  (before ssl, urllib3 and botocore are imported: see the package docstring)

import argparse
import json
import os
import signal
import sys

from serving.loadtest import ARGS_VARIABLE
from serving.loadtest.command import run

if __name__ == "__main__":
    # Ctrl-C ends the run early, even if inherited ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if ARGS_VARIABLE not in os.environ:
        sys.exit("run this through `serving loadtest ...` (see `serving loadtest --help`)")
    sys.exit(run(argparse.Namespace(**json.loads(os.environ.pop(ARGS_VARIABLE)))))
