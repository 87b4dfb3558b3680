"""The README demo: train a model with `serving train`, serve it beside the example endpoints, call
them all.

Trains examples/recipes/digits-cnn.yaml on two workers (Ray Train, embedded Ray) unless the model
store already holds it, then runs `serving up examples/direct.yaml examples/serial.yaml
examples/trained.yaml` on an embedded Ray, waits for the endpoints to be InService, then makes the
calls a user would make with curl and with an unmodified boto3 client, printing each one and its
answer. With --exit it stops after the calls. Ctrl-C or SIGTERM stops the server (and its Ray)
before the demo exits.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
TARGET = "X-Amzn-SageMaker-Target-Container-Hostname"

# The first image of scikit-learn's digits (a 0), 8x8 pixels in 0..16, as one row of 64 features.
DIGIT_ZERO = [
    0,
    0,
    5,
    13,
    9,
    1,
    0,
    0,
    0,
    0,
    13,
    15,
    10,
    15,
    5,
    0,
    0,
    3,
    15,
    2,
    0,
    11,
    8,
    0,
    0,
    4,
    12,
    0,
    0,
    8,
    8,
    0,
    0,
    5,
    8,
    0,
    0,
    9,
    8,
    0,
    0,
    4,
    11,
    0,
    1,
    12,
    7,
    0,
    0,
    2,
    14,
    5,
    10,
    12,
    0,
    0,
    0,
    0,
    6,
    13,
    10,
    0,
    0,
    0,
]
STORE = HERE.parent / "model-store"

CALLS = [
    # (endpoint, target container, body, what it shows)
    (
        "mce-direct",
        "iris",
        [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]],
        "iris classifier: class ids",
    ),
    (
        "mce-direct",
        "wine",
        [[13.2, 1.78, 2.14, 11.2, 100, 2.65, 2.76, 0.26, 1.28, 4.38, 1.05, 3.4, 1050]],
        "wine classifier: class probabilities",
    ),
    ("mce-direct", "labels", [0, 2], "python container: ids to names"),
    (
        "mce-serial",
        None,
        [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]],
        "serial: preprocess -> classifier -> labels",
    ),
    (
        "mce-trained",
        "digits",
        [DIGIT_ZERO],
        "the CNN `serving train` trained: ten class scores (a 0 here)",
    ),
]


def wait_in_service(
    base: str, names: list[str], server: subprocess.Popen, timeout: float = 300
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"serving up exited with code {server.returncode}")
        try:
            states = {
                n: httpx.get(f"{base}/endpoints/{n}", timeout=2).json().get("EndpointStatus")
                for n in names
            }
        except (httpx.HTTPError, ValueError):
            states = {}
        if states and all(s == "InService" for s in states.values()):
            return
        if "Failed" in states.values():
            raise SystemExit(f"an endpoint failed: {states}")
        time.sleep(1)
    raise SystemExit(f"endpoints not InService after {timeout:.0f} s")


def sample_calls(base: str) -> None:
    for endpoint, target, body, about in CALLS:
        header = f" -H '{TARGET}: {target}'" if target else ""
        print(
            f"\n# {about}\ncurl -s {base}/endpoints/{endpoint}/invocations -H 'Content-Type: application/json'"
            f"{header} -d '{json.dumps(body)}'"
        )
        headers = {"Content-Type": "application/json", **({TARGET: target} if target else {})}
        response = httpx.post(
            f"{base}/endpoints/{endpoint}/invocations", json=body, headers=headers, timeout=30
        )
        print(f"-> {response.status_code} {response.text}")
        response.raise_for_status()

    import boto3

    runtime = boto3.client(
        "sagemaker-runtime",
        endpoint_url=base,
        region_name="us-east-1",
        aws_access_key_id="demo",
        aws_secret_access_key="demo",
    )
    print("\n# the same serial call from an unmodified boto3 sagemaker-runtime client")
    result = runtime.invoke_endpoint(
        EndpointName="mce-serial", ContentType="text/csv", Body="5.1,3.5,1.4,0.2\n"
    )
    print(f"-> {result['Body'].read().decode()}")
    print("\n# a bad request gets a SageMaker-shaped error naming what is wrong")
    try:
        runtime.invoke_endpoint(
            EndpointName="mce-direct", ContentType="application/json", Body="[[1,2,3,4]]"
        )
    except runtime.exceptions.ValidationError as error:
        print(f"-> botocore ValidationError: {error.response['Error']['Message']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--exit", action="store_true", help="stop after the sample calls")
    args = parser.parse_args()
    if not (HERE / "models" / "iris-labels.tar.gz").exists():
        subprocess.run([sys.executable, str(HERE / "train_demo.py")], check=True)
    serving = Path(sys.executable).with_name("serving")
    if not (STORE / "digits-cnn" / "latest" / "model.tar.gz").exists():
        print(
            "training the digits CNN on two workers: serving train examples/recipes/digits-cnn.yaml",
            flush=True,
        )
        subprocess.run(
            [str(serving), "train", str(HERE / "recipes" / "digits-cnn.yaml")], check=True
        )

    base = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen(
        [
            str(serving),
            "up",
            str(HERE / "direct.yaml"),
            str(HERE / "serial.yaml"),
            str(HERE / "trained.yaml"),
            "--port",
            str(args.port),
        ]
    )
    stopping = False

    # SIGTERM (a service manager, `kill`): stop the server, then exit as after Ctrl-C
    def stop(*_) -> None:
        nonlocal stopping
        stopping = True
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    code = 0
    try:
        wait_in_service(base, ["mce-direct", "mce-serial", "mce-trained"], server)
        sample_calls(base)
        print(
            f"\nDemo endpoints are up at {base}.",
            "Stopping." if args.exit else "Press Ctrl-C to stop.",
            flush=True,
        )
        if not args.exit:
            # the server handles Ctrl-C; we wait for it
            signal.signal(signal.SIGINT, lambda *_: None)
            server.wait()
    except BaseException as error:
        if not stopping:
            print(f"demo failed: {error}", file=sys.stderr)
            code = 1
    finally:
        if server.poll() is None:
            # SIGTERM, not SIGINT: a server started where SIGINT is ignored (a background job)
            # ignores it too.
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
    if stopping:
        print("Stopped.", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
