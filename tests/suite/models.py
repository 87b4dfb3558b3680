"""The models the tests serve: the demos trained from scikit-learn's bundled datasets, handler scripts, a
MultiModel prefix and the S3-compatible server (moto, on loopback) that holds a copy, and it-secure's callers.
Each is made once per session, when a test first asks for it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def demo_models(tmp_path_factory) -> Path:
    """The README demo's models, trained once per test session into a temp folder."""
    out = tmp_path_factory.mktemp("demo-models")
    _example("train_demo").train(out)
    return out


@pytest.fixture(scope="session")
def hetero_models(tmp_path_factory) -> Path:
    """The heterogeneous demo's models (sklearn, PyTorch, TensorFlow, ONNX, Python), trained once per session.

    `expected.json` in the folder holds each model's sample request and the answer it must give.
    """
    out = tmp_path_factory.mktemp("hetero-models")
    _example("train_hetero").train(out)
    return out


@pytest.fixture(scope="session")
def hetero_expected(hetero_models) -> dict:
    """Per model folder of `hetero_models`: {"request", "response", "classes"} (see examples/train_hetero.py)."""
    return json.loads((hetero_models / "expected.json").read_text())


HANDLERS = {
    # predict_fn fails for every input: the model's own error must reach the caller as ModelError.
    "faulty": """
def predict_fn(data, model):
    raise RuntimeError("faulty model: cannot score this input")
""",
    # Sleeps for the seconds given in custom attributes ("sleep=2.5"): timeouts and backpressure.
    "sleepy": """
import json, time

def input_fn(body, content_type):
    return body

def predict_fn(data, model, context):
    seconds = float((context.custom_attributes or "sleep=0").split("=", 1)[1])
    time.sleep(seconds)
    return {"slept": seconds}
""",
    # InvokeEndpointWithResponseStream: output_fn returns a generator of JSON lines, each stamped with when it was
    # made; {"count": N, "gap": S, "fail": K} makes N chunks S seconds apart and raises before chunk K.
    "streamer": """
import json, time

def input_fn(body, content_type):
    return json.loads(body)

def predict_fn(data, model):
    return data

def output_fn(prediction, accept):
    def chunks():
        for index in range(prediction.get("count", 3)):
            if index == prediction.get("fail"):
                raise ValueError("the generator broke at chunk %d" % index)
            yield json.dumps({"index": index, "made": time.time()}) + "\\n"
            time.sleep(prediction.get("gap", 0))
    return chunks()  # a generator: each item is one part (content type: the Accept)
""",
    # Echoes what it received, with its content type: proves the serial hand-off.
    "echo": """
import json

def input_fn(body, content_type):
    # str for application/json and text/csv, bytes otherwise (as SageMaker's toolkits hand it over)
    return {"content_type": content_type, "body": body if isinstance(body, str) else body.decode()}

def predict_fn(data, model):
    return data

def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
""",
    # Emits CSV whatever it gets: the next container must receive text/csv.
    "to-csv": """
def input_fn(body, content_type):
    return body

def predict_fn(data, model):
    return "1.0,2.0\\n3.0,4.0\\n"

def output_fn(prediction, accept):
    return prediction, "text/csv"
""",
    # A hostile tenant: tries every way around the gateway it is told of, and reports what worked.
    "hostile": """
import json, os, socket, subprocess, sys, threading, urllib.request

CLUSTER_ATTEMPTS = {}  # slow ones (a Ray driver starting): run in the background, collected by a later request

def input_fn(body, content_type):
    return json.loads(body)

def _try(attempt):
    try:
        return "ALLOWED: " + str(attempt())[:200]
    except Exception as error:
        return "REFUSED: " + type(error).__name__ + ": " + str(error)[:200]

def _post(url):
    request = urllib.request.Request(url, data=b"[[5.1, 3.5, 1.4, 0.2]]", headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=10).read()

def _api(url):  # the control-plane API, anonymous on a loopback server that allows it
    request = urllib.request.Request(url, data=b"{}", headers={"Content-Type": "application/x-amz-json-1.1",
                                                               "X-Amz-Target": "SageMaker.ListEndpoints"})
    return urllib.request.urlopen(request, timeout=10).read()

def _delete(url):  # a control route (serving delete)
    return urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=10).read()

def _unix(path):
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    return "connected"

def _ray_driver(gcs):
    code = "import ray; ray.init(address=%r); print(ray.get_actor('serving-registry', namespace='serving').snapshot.remote(-1))" % gcs
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise RuntimeError((done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1])
    return done.stdout

def _gcs_kv(gcs):
    from ray._raylet import GcsClient
    return GcsClient(address=gcs).internal_kv_get(b"serving-root-secret", b"serving", timeout=10)

def predict_fn(targets, model):
    if "sockets" in targets:  # every socket the kernel offers, at the gateway's ports (tests/security/tenant_probe.py)
        return sockets_probe(targets["sockets"])
    if targets.get("collect_sockets"):
        return dict(_GOT)
    report = {}
    for path in targets.get("read", []):
        report["read " + path] = _try(lambda: open(path, "rb").read(64))
    for path in targets.get("list", []):
        report["list " + path] = _try(lambda: os.listdir(path))
    for path in targets.get("write", []):
        report["write " + path] = _try(lambda: open(path, "w").write("tenant was here"))
    for url in targets.get("post", []):
        report["post " + url] = _try(lambda: _post(url))
    for url in targets.get("api", []):
        report["api " + url] = _try(lambda: _api(url))
    for url in targets.get("delete", []):
        report["delete " + url] = _try(lambda: _delete(url))
    for path in targets.get("unix", []):
        report["unix " + path] = _try(lambda: _unix(path))
    for pid in targets.get("pids", []):
        report["signal %d" % pid] = _try(lambda: os.kill(pid, 0))
        report["environ %d" % pid] = _try(lambda: open("/proc/%d/environ" % pid, "rb").read(64))
        report["memory %d" % pid] = _try(lambda: open("/proc/%d/mem" % pid, "rb").read(1))
    if targets.get("gcs") and not CLUSTER_ATTEMPTS:
        def attack(gcs=targets["gcs"]):
            CLUSTER_ATTEMPTS["gcs kv"] = _try(lambda: _gcs_kv(gcs))
            CLUSTER_ATTEMPTS["ray driver"] = _try(lambda: _ray_driver(gcs))
        CLUSTER_ATTEMPTS["started"] = True
        threading.Thread(target=attack, daemon=True).start()
    if targets.get("collect"):
        return dict(CLUSTER_ATTEMPTS)
    report["environment"] = sorted(os.environ)
    report["supervisor"] = os.getppid()
    return report

def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
""",
    # Fails to load: the endpoint must become Failed with this reason, not hang.
    "broken": """
def model_fn(model_dir):
    raise ValueError("weights file is corrupt (test)")

def predict_fn(data, model):
    return data
""",
}


def _handler_dir(root: Path, name: str) -> Path:
    folder = root / name
    (folder / "code").mkdir(parents=True)
    code = HANDLERS[name]
    if name == "hostile":  # with the socket probe's functions (not its handler's)
        probe = (Path(__file__).parents[1] / "security" / "tenant_probe.py").read_text()
        code = probe[: probe.index("def input_fn")] + code
    (folder / "code" / "inference.py").write_text(code)
    return folder


@pytest.fixture(scope="session")
def handler_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("handlers")
    return {name: _handler_dir(root, name) for name in HANDLERS}


# Callers of it-secure, the one endpoint with AccessControl: SageMaker's documented example
# (team-a may invoke customIps* and common* containers only, team-b everything but special*).
ACCESS_CALLERS = {
    "team-a": {
        "AccessKeyId": "AKIAINTEGTEAMA0001",
        "SecretAccessKey": "team-a-integration-secret",
        "PolicyDocuments": ["customips-and-common.json"],
    },
    "team-b": {
        "AccessKeyId": "AKIAINTEGTEAMB0002",
        "SecretAccessKey": "team-b-integration-secret",
        "PolicyDocuments": ["all-but-special.json"],
    },
    "batch-job": {"ApiKey": "batch-job-integration-api-key", "PolicyDocuments": ["all-but-special.json"]},
}


@pytest.fixture(scope="session")
def access_callers() -> dict[str, dict]:
    """Principal -> its credentials (and policy file names) in it-secure's identities file."""
    return ACCESS_CALLERS


@pytest.fixture(scope="session")
def identities_file(tmp_path_factory) -> Path:
    """it-secure's identities file, attaching the example policies shipped in policies/."""
    policies = ROOT / "policies"
    entries = [
        {"Principal": name, **fields, "PolicyDocuments": [str(policies / p) for p in fields["PolicyDocuments"]]}
        for name, fields in ACCESS_CALLERS.items()
    ]
    path = tmp_path_factory.mktemp("access") / "identities.yaml"
    path.write_text(yaml.safe_dump({"Identities": entries}))
    return path


# InstanceType -> what one instance reserves, for endpoints created through the SageMaker API in tests
# (tests/integration/test_sagemaker_api.py, whose servers are its own: beside a session server of ~60 replicas,
# a walkthrough's replicas took the node past Ray's memory threshold).
API_INSTANCE_TYPES = {"ml.m5.large": {"Cpus": 0.02}, "ml.c5.large": {"Cpus": 0.04}}


@pytest.fixture(scope="session")
def api_instance_types(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("api") / "instance-types.json"
    path.write_text(__import__("json").dumps({"InstanceTypes": API_INSTANCE_TYPES}))
    return path


# it-multi: MultiModel containers. `local` serves a folder of models through a cache of 3 on two
# replicas; `cloud` serves the same models from an S3 bucket (a local S3-compatible server).
MULTI_MODELS = 12

S3_BUCKET = "it-models"

AWS_TEST_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def multi_model_prefix(demo_models, tmp_path_factory) -> Path:
    """A MultiModel prefix: iris-0.tar.gz ... (the demo's iris classifier, as SageMaker archives) and
    echo-model/ (a Python model that answers with its own name)."""
    import tarfile

    root = tmp_path_factory.mktemp("multi-model-prefix")
    for index in range(MULTI_MODELS):
        with tarfile.open(root / f"iris-{index}.tar.gz", "w:gz") as archive:
            archive.add(demo_models / "iris-classifier", arcname=".")
    echo = root / "echo-model" / "code"
    echo.mkdir(parents=True)
    (echo / "inference.py").write_text(
        "def model_fn(model_dir):\n    return 'echo-model'\n\n"
        "def predict_fn(data, model):\n    return {'model': model, 'input': data}\n"
    )
    return root


@pytest.fixture(scope="session")
def s3_models(multi_model_prefix) -> str:
    """An S3-compatible server on loopback (moto: no cloud is reachable from the tests) holding the
    prefix's models under s3://it-models/team-a/; returns its URL. Stopped at the end of the session."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per S3 request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    try:
        s3 = boto3.client(
            "s3",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        s3.create_bucket(Bucket=S3_BUCKET)
        for path in sorted(multi_model_prefix.rglob("*")):
            if path.is_file():
                s3.upload_file(str(path), S3_BUCKET, f"team-a/{path.relative_to(multi_model_prefix).as_posix()}")
        yield url
    finally:
        server.stop()
