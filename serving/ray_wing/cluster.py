"""Ray itself: start the embedded instance or join a cluster, with authentication on; the root secret.

Ray's ports cannot all be kept on loopback (Ray resolves a loopback node address to the machine's
own, and the GCS, raylet and workers listen on every interface), so what protects them is Ray's
token authentication: on for the embedded instance, required of a cluster unless the operator
says otherwise. The embedded instance gets a fresh random token in a private file for each run.
Every capability of `keys` derives from that token, which every trusted Ray process holds and no
container process (`container_main`) ever sees.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from serving import protocol

logger = logging.getLogger("serving.cluster")

NAMESPACE = protocol.RAY_NAMESPACE
METRICS_REPORT_INTERVAL_MS = (
    5000  # embedded Ray: how often replicas push their metrics to the node agent
)
AUTH_MODE_ENV, TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
# What the embedded Ray starts with unless the environment already says otherwise (docs/benchmarks/bench_idle.md):
EMBEDDED_RAY_ENVIRONMENT = {
    # Ray starts its workers (the gateway, every replica and so their container processes) this much nicer than
    # the process that starts it: 15 by default, so any ordinary process on the machine took their CPU first.
    "RAY_worker_niceness": "0",
    # Each Serve replica and router woke every 100 ms to export Serve's cached request metrics, which this
    # runtime's data path (plain HTTP to the container processes) barely moves: once a second is enough.
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
    # Every worker runs this first: Serve's utilities then skip pandas, which they load only for the HTTP proxy
    # this runtime does not run (~30 MiB and a few tenths of a CPU-second per Serve worker; serving/_worker_preload.py).
    "RAY_preload_python_modules": "serving._worker_preload",
    # Ray's log monitor (started only when workers' output is shown: `_lean_head`) looked for new worker log files
    # with three globs of the session's log folder every 0.1 s (under 1,000 files): once a second is soon enough.
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
    "LOG_NAME_UPDATE_INTERVAL_S": "1",
    # The Serve controller reconciled every 0.1 s, asking the GCS for the cluster's nodes each time, the largest
    # idle cost left once containers are hosted (they start without it): every 0.5 s. A Serve replica's start, a
    # health check's verdict and Serve's own autoscaling step now wait up to 0.5 s for a tick.
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    # Ray reports usage statistics (cluster shape, libraries used) to its authors unless told not to: a server
    # does not phone home on its operator's behalf.
    "RAY_USAGE_STATS_ENABLED": "0",
    # The raylet connects to its object store, which it has just started on a thread of its own, and on a busy
    # machine sometimes before the store listens: it tried again after 1 s, with the whole node's start waiting
    # (docs/benchmarks/bench_server_up.md). Every 0.1 s instead, as many times more: the same 10 s bound.
    "RAY_raylet_client_connect_timeout_milliseconds": "100",
    "RAY_raylet_client_num_connect_attempts": "100",
}
_ROOT_KV_KEY = b"serving-root-secret"  # only used by a cluster that runs without authentication

_token_dir: str | None = None
_quiet_serve = False


def quiet_serve_notices() -> None:
    """Keep Serve's notices off the console of the embedded server's process (unless
    SERVING_RAY_LOGS=1); again after Serve is imported, which sets its logger's level itself."""
    if _quiet_serve:
        logging.getLogger("ray.serve").setLevel(logging.WARNING)


class UnauthenticatedClusterError(RuntimeError):
    """The Ray cluster accepts connections without a token: anyone who reaches it can run code there."""


def start_local_ray(num_cpus: int | None = None, log_to_driver: bool | None = None) -> None:
    """Start a fresh Ray on this machine (never attach to a cluster found by accident), token auth on.

    Unless the environment already names a token (RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH), a new random
    one is written to a private (0600) file for this run only and removed at `stop_local_ray`.
    """
    import ray

    global _token_dir
    if os.environ.get(AUTH_MODE_ENV, "token").lower() != "token":
        raise RuntimeError(
            f"{AUTH_MODE_ENV}={os.environ[AUTH_MODE_ENV]} would start Ray without authentication, "
            "so that anyone on this machine's network could run code as this user; unset it"
        )
    if not os.environ.get(TOKEN_ENV) and not os.environ.get(TOKEN_PATH_ENV):
        _token_dir = tempfile.mkdtemp(prefix="serving-ray-")  # mode 0700
        token_file = Path(_token_dir) / "auth_token"
        token_file.touch(mode=0o600)
        token_file.write_text(secrets.token_hex(32))
        os.environ[TOKEN_PATH_ENV] = str(token_file)
    _use_token_auth()
    for (
        name,
        value,
    ) in EMBEDDED_RAY_ENVIRONMENT.items():  # read by the raylet ray.init starts, and its workers
        os.environ.setdefault(name, value)
    global _quiet_serve
    # Serve's notices in this process ("Started Serve", ...), from here and once Serve is imported
    _quiet_serve = os.environ.get("SERVING_RAY_LOGS", "0") != "1"
    quiet_serve_notices()
    logging_to_driver = (
        os.environ.get("SERVING_RAY_LOGS", "0") == "1" if log_to_driver is None else log_to_driver
    )
    with _driver_directory(), _lean_head(logging_to_driver):
        ray.init(
            address="local",
            include_dashboard=False,
            num_cpus=num_cpus,
            namespace=NAMESPACE,
            # Workers' output reaches this console only when asked (the trainer's progress bars and metrics do).
            log_to_driver=logging_to_driver,
            configure_logging=False,
            # replicas' metrics reach GET /metrics within this period (Ray's default: 10 s)
            _system_config={"metrics_report_interval_ms": METRICS_REPORT_INTERVAL_MS},
        )


def stop_local_ray() -> None:
    """Shut the embedded Ray down and remove this run's token."""
    import ray

    global _token_dir
    try:
        ray.shutdown()
    finally:
        if _token_dir is not None:
            shutil.rmtree(_token_dir, ignore_errors=True)
            if os.environ.get(TOKEN_PATH_ENV, "").startswith(_token_dir):
                del os.environ[TOKEN_PATH_ENV]
            _token_dir = None


def connect_cluster(address: str, allow_unauthenticated: bool = False) -> None:
    """Attach to an existing Ray cluster; refuse one without token authentication unless allowed."""
    import ray

    if not address.startswith("ray://") and cluster_accepts_anyone(address):
        if not allow_unauthenticated:
            raise UnauthenticatedClusterError(
                f"the Ray cluster at {address} accepts connections without an authentication token: anyone who "
                "can reach its ports can run code on it and read what it holds. Start it with RAY_AUTH_MODE=token "
                "(deploy/README.md), or pass --allow-unauthenticated-ray to use it anyway"
            )
        logger.warning(
            "the Ray cluster at %s has no authentication: anyone who reaches it controls these endpoints",
            address,
        )
    elif address.startswith("ray://"):
        logger.warning(
            "cannot check that the Ray Client address %s requires a token; make sure the cluster runs "
            "with RAY_AUTH_MODE=token",
            address,
        )
    if os.environ.get(AUTH_MODE_ENV) is None and not allow_unauthenticated:
        _use_token_auth()
    with _driver_directory():
        ray.init(address=address, namespace=NAMESPACE)


# Head-node processes `ray.init` starts that the embedded server never uses (docs/benchmarks/bench_server_up.md):
# the dashboard head (with `include_dashboard=False` it runs only Ray's usage-stats reporter, which this runtime
# turns off, and `ray.init` waits for it to come up), the autoscaler monitor (a machine's Ray has no nodes to add)
# and, unless workers' output is shown here, the log monitor (which only forwards that output). Each is a Python
# process of ~50-80 MiB, the first two with a Prometheus port on every interface.
_UNUSED_MONITOR, _LOG_FORWARDER = "start_monitor", "start_log_monitor"
# Where the dashboard head would have registered, for the node agent's event reporter, which otherwise asks for it
# once a second forever and logs a traceback each time: an address that refuses at once (a Ray event, which is
# rare, is then logged by the agent as not reported; nothing here reads Ray's events).
NO_DASHBOARD = b"http://127.0.0.1:0"


@contextlib.contextmanager
def _lean_head(logging_to_driver: bool) -> Iterator[None]:
    """While `ray.init` starts the embedded head node, start neither the dashboard head nor the autoscaler
    monitor, nor the log monitor unless `logging_to_driver`: Ray's `RayParams` has switches for the two monitors
    but `ray.init` passes none, and none for the dashboard head. And learn whether the node agent's dependencies
    are installed without importing them here (`dashboard_dependency_error`)."""
    from ray._private import utils
    from ray._private.node import Node

    replaced = {"start_api_server": _register_no_dashboard, _UNUSED_MONITOR: _not_started}
    if not logging_to_driver:
        replaced[_LOG_FORWARDER] = _not_started
    originals = {name: getattr(Node, name) for name in replaced}
    for name, replacement in replaced.items():
        setattr(Node, name, replacement)
    ray_check = utils.get_dashboard_dependency_error
    utils.get_dashboard_dependency_error = dashboard_dependency_error
    try:
        yield
    finally:
        utils.get_dashboard_dependency_error = ray_check
        for name, original in originals.items():
            setattr(Node, name, original)


def dashboard_dependency_error() -> ImportError | None:
    """Ray's `get_dashboard_dependency_error`, answered by the import system's finders: whether each module that
    `ray.dashboard.optional_deps` imports can be found (None: all can; the node agent then runs in full, as it
    must to export metrics). Ray's own check imports them all (aiohttp, grpc, OpenTelemetry, ...) into the process
    starting the node, which uses none of them, on the way from the GCS's start to the raylet's."""
    import ray.dashboard

    try:
        statements = ast.parse(
            Path(ray.dashboard.__file__).with_name("optional_deps.py").read_text()
        ).body
    except (OSError, SyntaxError):  # another Ray's layout: its own check, which imports them
        try:
            import ray.dashboard.optional_deps  # noqa: F401
        except ImportError as error:
            return error
        return None
    for statement in statements:
        if isinstance(statement, ast.Import):
            names = [alias.name for alias in statement.names]
        elif isinstance(statement, ast.ImportFrom) and statement.module and not statement.level:
            names = [statement.module]
        else:
            continue
        for name in names:
            if not _findable(name):
                return ModuleNotFoundError(f"No module named '{name}'", name=name)
    return None


def _findable(name: str) -> bool:
    """Whether `name` can be imported, importing at most namespace packages to find out: a submodule of a
    regular package (`aiohttp.web`) is taken to come with it."""
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        try:
            spec = importlib.util.find_spec(".".join(parts[:depth]))
        except (ImportError, ValueError):
            return False
        if spec is None:
            return False
        if spec.origin not in (None, "namespace"):
            return True  # a regular package or module: what is below it ships with it
    return True


def _not_started(node: Any, **_: object) -> None:
    """In place of a `Node.start_*` method that `_lean_head` skips."""


def _register_no_dashboard(node: Any, **_: object) -> None:
    """In place of `Node.start_api_server`: register `NO_DASHBOARD` as the dashboard head does its address,
    before the node's agent starts."""
    from ray._private import ray_constants

    node.get_gcs_client().internal_kv_put(
        ray_constants.DASHBOARD_ADDRESS.encode(),
        NO_DASHBOARD,
        True,
        ray_constants.KV_NAMESPACE_DASHBOARD,
    )


@contextlib.contextmanager
def _driver_directory() -> Iterator[None]:
    """Connect as a driver from `/`: Ray puts the driver's working directory first on every worker's `sys.path`
    (job config `py_driver_sys_path`), so a `serving/` folder there (a model root, a folder a container may write)
    would be the code every replica and the gateway import. `/` holds no such folder on any node."""
    here = os.getcwd()
    os.chdir("/")
    try:
        yield
    finally:
        os.chdir(here)


def _use_token_auth() -> None:
    """Token mode for this process and the Ray processes it starts (Ray read its config at import)."""
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]  # compiled module

    os.environ[AUTH_MODE_ENV] = "token"
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


_PROBE = """
import sys
from ray._raylet import GcsClient
try:
    GcsClient(address=sys.argv[1], cluster_id=None).internal_kv_get(b"serving-probe", None, timeout=5)
except Exception as error:
    print(type(error).__name__, error)
    sys.exit(1)
"""


def cluster_accepts_anyone(address: str) -> bool:
    """Whether the GCS at `address` answers a client that presents no token (in a clean child process)."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in (TOKEN_ENV, TOKEN_PATH_ENV, AUTH_MODE_ENV)
    }
    environment[AUTH_MODE_ENV] = "disabled"
    environment["HOME"] = tempfile.gettempdir()  # no ~/.ray/auth_token either
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, address],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode == 0


def cluster_secret() -> bytes:
    """The root of every capability in `keys`, derived from Ray's authentication token (in any Ray process).

    On a cluster without authentication (only with --allow-unauthenticated-ray) there is no token: a
    random root kept in Ray's key-value store stands in, readable by anyone who can reach the cluster.
    """
    from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]  # compiled module

    loader = AuthenticationTokenLoader.instance()
    if loader.has_token():
        return hashlib.sha256(b"serving-root\0" + loader.get_raw_token().encode()).digest()
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(
        _ROOT_KV_KEY, secrets.token_bytes(32), overwrite=False, namespace=NAMESPACE
    )
    return internal_kv._internal_kv_get(_ROOT_KV_KEY, namespace=NAMESPACE)
