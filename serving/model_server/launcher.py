"""The container process's first step: confine itself, then become the model server (`main`) by
`exec`.

The supervisor starts this with `python -I -S -B` and an environment it chose itself, holding
nothing of the container's `Environment`: the dynamic loader, glibc and the interpreter read no
variable a caller chose before the sandbox is on. This reads the sandbox policy and the model
server's environment from its stdin, applies the sandbox (`sandbox.apply`, while this process has
one thread: its own network namespace first), and `exec`s the model server with that environment.
The namespace, Landlock, seccomp and no-new-privileges outlive `exec`, so whatever the environment
makes the loader or the interpreter do happens inside the sandbox. The model server gets its
configuration, with what the sandbox applied, on a new stdin (a memfd). A container process forked
from its stack's template (`fork_template`) runs the same `confine`, then the model server without
the `exec`. The standard library only.
"""

from __future__ import annotations

import json
import os
import sys

from serving.model_server import sandbox

# The model server, from the `serving` package this launcher came from (`-I` keeps PYTHONPATH out).
MAIN = "import runpy, sys; sys.path.insert(0, sys.argv[1]); runpy.run_module('serving.model_server.main', run_name='__main__')"


def confine(config: dict) -> tuple[dict, dict[str, str]] | None:
    """Apply the sandbox the launcher's document names (while this process has one thread); returns
    the model server's configuration, with what the sandbox applied, and its environment. None when
    the sandbox failed, after telling the supervisor why on the status pipe."""
    policy = config.pop("sandbox")
    environment = config.pop("process_environment")
    report = sandbox.SandboxReport()
    if policy["mode"] != "off":
        try:
            report = sandbox.apply(
                sandbox.SandboxPolicy(
                    read=tuple(policy["read"]),
                    write=tuple(policy["write"]),
                    devices=tuple(policy["devices"]),
                    network=policy["network"],
                    connect_ports=tuple(policy["connect_ports"]),
                    own_port=policy["own_port"],
                    shared_fallback=policy["shared_fallback"],
                ),
                require=policy["mode"] == "required",
            )
        except sandbox.SandboxError as error:
            with os.fdopen(config["status_fd"], "w") as status:
                status.write(json.dumps({"error": f"sandbox: {error}"}) + "\n")
            return None
    config["sandbox_report"] = {
        "landlock_abi": report.landlock_abi,
        "seccomp": report.seccomp,
        "capabilities_dropped": report.capabilities_dropped,
        "network": report.network,
        "connect_ports": report.connect_ports,
    }
    # its data port, as the container itself sees it (`context.rest_uri`)
    if report.loopback_fd is not None:
        config["loopback_fd"] = report.loopback_fd
        config["data_url"] = f"http://127.0.0.1:{policy['own_port']}"
    return config, environment


def main() -> int:
    confined = confine(json.loads(sys.stdin.buffer.read()))
    if confined is None:
        return 2
    config, environment = confined
    config.pop("cwd", None)  # the supervisor started it there
    if hasattr(os, "memfd_create"):  # Linux: a file in memory only, never on disk
        stdin = os.memfd_create("serving-container-config")
    else:  # macOS and the like (no sandbox there): an unlinked temporary file
        import tempfile

        stdin = os.dup(tempfile.TemporaryFile().fileno())
    os.write(stdin, json.dumps(config).encode())
    os.lseek(stdin, 0, os.SEEK_SET)
    os.dup2(stdin, 0)
    os.close(stdin)
    os.execve(sys.executable, [sys.executable, "-I", "-B", "-c", MAIN, sys.argv[1]], environment)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
