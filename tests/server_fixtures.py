"""One embedded Ray + endpoint server per test session, and in it the endpoints each test module uses.

Imported by tests/conftest.py, so that the integration and the security suites share one Ray and one gateway
(started when a test first asks for them, with no endpoints). A module that uses endpoints names them in
`ENDPOINTS` (catalogue names: `CATALOGUE` below) and asks for the `server` fixture, which deploys those not
running yet, waits for them (bounded) and, after the last module that names one has run, deletes it: a module
deploys no more than it uses, an endpoint is built once however many modules share it, and an endpoint that
fails to start fails the modules that name it only. Every wait is bounded; everything is torn down at the end
of the session.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from serving.config.spec import parse_spec
from serving.settings import ServerSettings

_LAST_USER = pytest.StashKey[dict]()
READY_TIMEOUT_S = 1500  # one module's endpoints (at most ~25 replicas, it-fifteen's TensorFlow and PyTorch ones
# among them) start on 2 shared CPUs; when one session server started ~60 at once, a slower VM of this size took
# 12 minutes for 57 of them


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected what will not run
def pytest_collection_modifyitems(config, items):
    # A module's set-up (training, Ray, its endpoints) is bounded by READY_TIMEOUT_S, not by the
    # per-test timeout of whichever test happens to request it first: that one times its own body only.
    for item in items:
        if item.get_closest_marker("integration") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(float(item.config.getini("timeout") or 300), func_only=True))
    # Tests that start an embedded Ray of their own (`serving train` runs) go right after the demo's, before the
    # session's Ray starts: two Rays at once on 2 cores start slowly, and beside a module's replicas, too slowly.
    first = [item for item in items if item.get_closest_marker("e2e")]
    own_ray = [item for item in items if item.get_closest_marker("own_ray") and not item.get_closest_marker("e2e")]
    chosen = {id(item) for item in first + own_ray}
    items[:] = first + own_ray + [item for item in items if id(item) not in chosen]
    last_user = {}  # endpoint -> the module that uses it last, in the order the tests run: it deletes it
    for item in items:
        for name in getattr(item.module, "ENDPOINTS", ()):
            last_user[name] = item.nodeid.split("::")[0]
    config.stash[_LAST_USER] = last_user


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
        probe = (Path(__file__).parent / "security" / "tenant_probe.py").read_text()
        code = probe[: probe.index("def input_fn")] + code
    (folder / "code" / "inference.py").write_text(code)
    return folder


# The hostile tenant's Environment (tests/security): a variable that must reach its container process only.
TENANT_CANARY = "SERVING_TENANT_CANARY"


def tenant_environment(handlers: dict[str, Path]) -> dict[str, str]:
    return {TENANT_CANARY: "set-by-the-tenant"}


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
    policies = Path(__file__).resolve().parents[1] / "policies"
    entries = [
        {"Principal": name, **fields, "PolicyDocuments": [str(policies / p) for p in fields["PolicyDocuments"]]}
        for name, fields in ACCESS_CALLERS.items()
    ]
    path = tmp_path_factory.mktemp("access") / "identities.yaml"
    path.write_text(yaml.safe_dump({"Identities": entries}))
    return path


def access_endpoint_spec(demo: Path, identities: Path) -> dict:
    """it-secure: Direct, three containers named after the documented example, with AccessControl."""
    return {
        "EndpointName": "it-secure",
        "AccessControl": {"IdentitiesFile": str(identities)},
        "Containers": [
            {"ContainerHostname": "customIps-iris", "Image": "sklearn", "ModelDataUrl": str(demo / "iris-classifier")},
            {"ContainerHostname": "common-wine", "Image": "sklearn", "ModelDataUrl": str(demo / "wine-classifier")},
            {
                "ContainerHostname": "special-labels",
                "Image": "python",
                "ModelDataUrl": str(demo / "iris-labels.tar.gz"),
            },
        ],
    }


def v2_output_matches(container: str, got, invoked) -> bool:
    """Whether an it-fifteen container's V2 output tensor says what its InvokeEndpoint answer says: python-rules'
    labels as a BYTES tensor, tensorflow-keras' TF Serving `{"predictions": ...}`, the others the same numbers."""
    import numpy as np

    if container == "python-rules":
        return [item.decode() for item in got.reshape(-1)] == invoked
    if container == "tensorflow-keras":
        return bool(np.allclose(got, np.asarray(invoked["predictions"]), atol=1e-5))
    return bool(np.allclose(got, np.asarray(invoked), atol=1e-5))


@pytest.fixture(scope="session")
def v2_matches():
    """`v2_matches(container, got, invoked)`: see v2_output_matches."""
    return v2_output_matches


# it-fifteen: three containers of each of the five stacks, one per artifact layout of
# examples/train_hetero.py. Hostname -> (Image, model folder in hetero_models, Environment).
FIFTEEN = {
    "sklearn-features": ("sklearn", "hetero-features", {}),
    "sklearn-iris": ("sklearn", "hetero-iris-sklearn", {}),
    "sklearn-wine": ("sklearn", "hetero-wine-sklearn", {"SERVING_SKLEARN_METHOD": "predict_proba"}),
    "pytorch-script": ("pytorch", "hetero-iris-torchscript", {}),
    "pytorch-export": ("pytorch", "hetero-wine-export", {"SERVING_ALLOW_PICKLE": "true"}),  # a .pt2 runs code
    "pytorch-state": ("pytorch", "hetero-iris-state", {}),
    "tensorflow-saved": ("tensorflow", "hetero-tf-features", {}),
    "tensorflow-keras": ("tensorflow", "hetero-tf-iris", {}),
    "tensorflow-archive": ("tensorflow", "hetero-tf-wine.tar.gz", {}),
    "onnx-iris": ("onnx", "hetero-onnx-iris", {}),
    "onnx-two": ("onnx", "hetero-onnx-two", {}),
    "onnx-features": ("onnx", "hetero-onnx-features", {}),
    "python-labels": ("python", "hetero-labels", {}),
    "python-wine-labels": ("python", "hetero-wine-labels", {}),
    "python-rules": ("python", "hetero-rules", {}),
}


@pytest.fixture(scope="session")
def fifteen_containers() -> dict[str, tuple[str, str, dict]]:
    """it-fifteen's containers: hostname -> (Image, model folder of hetero_models, Environment)."""
    return FIFTEEN


# it-runtime-env: a handler importing a module that only its RuntimeEnvironment.WorkingDir holds.
WORKING_DIR_HANDLER = """
import json, os
import wd_helper  # lives in the working dir, not in the model directory

def predict_fn(data, model):
    return {"helper": wd_helper.NAME, "cwd": os.getcwd(), "cpus": os.environ.get("SERVING_CPUS")}

def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
"""


@pytest.fixture(scope="session")
def working_dir_model(tmp_path_factory) -> tuple[Path, Path]:
    """(model directory, working directory) of it-runtime-env."""
    root = tmp_path_factory.mktemp("runtime-env")
    (root / "model" / "code").mkdir(parents=True)
    (root / "model" / "code" / "inference.py").write_text(WORKING_DIR_HANDLER)
    (root / "lib").mkdir()
    (root / "lib" / "wd_helper.py").write_text("NAME = 'from the working dir'\n")
    return root / "model", root / "lib"


# The session's Ray has 2 logical CPUs and every other replica reserves 0.05 of them: the
# containers added after it-fifteen reserve less, so that all replicas can be placed.
TINY = {"Cpus": 0.01}
# InstanceType -> what one instance reserves, for endpoints created through the SageMaker API in tests
# (tests/integration/test_sagemaker_api.py, whose servers are its own: beside a session server of ~60 replicas,
# a walkthrough's replicas took the node past Ray's memory threshold).
API_INSTANCE_TYPES = {"ml.m5.large": {"Cpus": 0.02}, "ml.c5.large": {"Cpus": 0.04}}


@pytest.fixture(scope="session")
def api_instance_types(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("api") / "instance-types.json"
    path.write_text(__import__("json").dumps({"InstanceTypes": API_INSTANCE_TYPES}))
    return path


def hetero_endpoint_specs(hetero: Path, working_dir_model: tuple[Path, Path]) -> list[dict]:
    """it-fifteen (Direct, all five stacks), two Serial chains across frameworks, and it-runtime-env."""
    c = lambda host, image, model, **extra: {
        "ContainerHostname": host,
        "Image": image,
        "ModelDataUrl": str(hetero / model),
        "Resources": TINY,
        **extra,
    }
    fifteen = [
        c(host, image, model, Environment=env, Resources={"Cpus": 0.05})
        for host, (image, model, env) in FIFTEEN.items()
    ]
    return [
        {"EndpointName": "it-fifteen", "Containers": fifteen},
        # scikit-learn features -> TensorFlow classifier -> Python labels (examples/hetero-serial.yaml)
        {
            "EndpointName": "it-hetero-serial",
            "InferenceExecutionConfig": {"Mode": "Serial"},
            "Containers": [
                c("features", "sklearn", "hetero-features"),
                c("classifier", "tensorflow", "hetero-tf-features"),
                c("labels", "python", "hetero-labels"),
            ],
        },
        # the same chain with an ONNX classifier, handed NPY by the first container, batching concurrent requests
        {
            "EndpointName": "it-hetero-serial-onnx",
            "InferenceExecutionConfig": {"Mode": "Serial"},
            "Containers": [
                c(
                    "features",
                    "sklearn",
                    "hetero-features",
                    Environment={"SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "application/x-npy"},
                ),
                c("classifier", "onnx", "hetero-onnx-features", Batching={"MaxBatchSize": 16, "MaxDelayMs": 20}),
                c("labels", "python", "hetero-labels"),
            ],
        },
        {
            "EndpointName": "it-runtime-env",
            "Containers": [
                {
                    "ContainerHostname": "wd",
                    "Image": "python",
                    "ModelDataUrl": str(working_dir_model[0]),
                    "Resources": TINY,
                    "RuntimeEnvironment": {"WorkingDir": str(working_dir_model[1])},
                },
            ],
        },
    ]


def endpoint_specs(demo: Path, handlers: dict[str, Path]) -> list[dict]:
    py = lambda host, name, **extra: {
        "ContainerHostname": host,
        "Image": "python",
        "ModelDataUrl": str(handlers[name]),
        **extra,
    }
    sk = lambda host, model, **extra: {
        "ContainerHostname": host,
        "Image": "sklearn",
        "ModelDataUrl": str(demo / model),
        **extra,
    }
    return [
        {
            "EndpointName": "it-direct",
            "Containers": [
                sk("iris", "iris-classifier"),
                sk("wine", "wine-classifier", Environment={"SERVING_SKLEARN_METHOD": "predict_proba"}),
                {"ContainerHostname": "labels", "Image": "python", "ModelDataUrl": str(demo / "iris-labels.tar.gz")},
                py("faulty", "faulty"),
                py("sleepy", "sleepy"),
                py("narrow", "sleepy", Environment={"SERVING_MAX_CONCURRENCY": "1"}),
            ],
        },
        {
            "EndpointName": "it-single",
            "Containers": [sk("only", "iris-classifier", AutoScaling={"MinCapacity": 2, "MaxCapacity": 2})],
        },
        {
            "EndpointName": "it-serial",
            "InferenceExecutionConfig": {"Mode": "Serial"},
            "Containers": [
                sk("preprocess", "iris-preprocess"),
                sk("classifier", "iris-on-features"),
                {"ContainerHostname": "labels", "Image": "python", "ModelDataUrl": str(demo / "iris-labels.tar.gz")},
            ],
        },
        {
            "EndpointName": "it-handoff",
            "InferenceExecutionConfig": {"Mode": "Serial"},
            "Containers": [
                py("first", "to-csv"),
                py("second", "echo"),
            ],
        },
        {
            "EndpointName": "it-serial-fail",
            "InferenceExecutionConfig": {"Mode": "Serial"},
            "Containers": [
                sk("preprocess", "iris-preprocess"),
                py("faulty", "faulty"),
                py("never", "echo"),
            ],
        },
        {"EndpointName": "it-broken", "Containers": [py("fine", "echo"), py("broken", "broken")]},
        # tests/integration/test_reliability.py: replicas, the registry and the gateway are killed under load;
        # `twin` has two replicas (one dies), `solo` one; it-spare is deleted and it-update updated live.
        {
            "EndpointName": "it-chaos",
            "Containers": [
                py("twin", "sleepy", Resources=TINY, AutoScaling={"MinCapacity": 2, "MaxCapacity": 2}),
                py("solo", "echo", Resources=TINY),
            ],
        },
        {"EndpointName": "it-spare", "Containers": [py("only", "echo", Resources=TINY)]},
        # tests/integration/test_response_stream.py: a container whose output_fn yields chunks
        {"EndpointName": "it-stream", "Containers": [py("streamer", "streamer", Resources=TINY)]},
        {
            "EndpointName": "it-update",
            "Containers": [py("first", "echo", Resources=TINY), py("second", "echo", Resources=TINY)],
        },
        # tests/security: a tenant's model that attacks its neighbour, the gateway and the cluster
        {
            "EndpointName": "it-hostile",
            "Containers": [
                py("tenant", "hostile", Resources=TINY, Environment=tenant_environment(handlers)),
                py("victim", "echo", Resources=TINY),
            ],
        },
    ]


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


def multi_model_spec(prefix: Path, s3_url: str) -> dict:
    return {
        "EndpointName": "it-multi",
        "Containers": [
            {
                "ContainerHostname": "local",
                "Image": "sklearn",
                "Mode": "MultiModel",
                "ModelDataUrl": str(prefix),
                "Environment": {"SERVING_MAX_MODELS": "3"},
                "AutoScaling": {"MinCapacity": 2, "MaxCapacity": 2},
                "Resources": TINY,
            },
            {
                "ContainerHostname": "cloud",
                "Image": "sklearn",
                "Mode": "MultiModel",
                "ModelDataUrl": f"s3://{S3_BUCKET}/team-a/",
                "Environment": {**AWS_TEST_ENVIRONMENT, "SERVING_S3_ENDPOINT_URL": s3_url, "SERVING_MAX_MODELS": "3"},
                "Resources": TINY,
            },
            {
                "ContainerHostname": "once",
                "Image": "python",
                "Mode": "MultiModel",
                "ModelDataUrl": str(prefix),
                "MultiModelConfig": {"ModelCacheSetting": "Disabled"},
                "Resources": TINY,
            },
        ],
    }


# it-async: InvokeEndpointAsync on the session's S3-compatible server (tests/integration/test_async_invocations.py).
ASYNC_BUCKET = "it-async"


def async_endpoint_spec(handlers: dict[str, Path], s3_url: str) -> dict:
    return {
        "EndpointName": "it-async",
        "Containers": [
            {
                "ContainerHostname": "sleepy",
                "Image": "python",
                "ModelDataUrl": str(handlers["sleepy"]),
                "Resources": TINY,
            }
        ],
        "AsyncInferenceConfig": {
            "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 2},
            "OutputConfig": {
                "S3OutputPath": f"s3://{ASYNC_BUCKET}/answers",
                "S3FailurePath": f"s3://{ASYNC_BUCKET}/failures/",
            },
            "InputConfig": {"S3InputPath": f"s3://{ASYNC_BUCKET}/inputs/"},
            "S3EndpointUrl": s3_url,
        },
    }


# it-capture*: DataCaptureConfig (tests/integration/test_data_capture.py): every call to a folder, 30% to the
# session's S3-compatible server, and a destination that refuses every write (a file where its folder would be).
CAPTURE_BUCKET = "it-capture"


@pytest.fixture(scope="session")
def capture_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("capture")
    (root / "blocked").write_text("a file where the capture folder would be")
    return root


def capture_endpoint_specs(handlers: dict[str, Path], root: Path, s3_url: str) -> list[dict]:
    options = [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}]

    def endpoint(name: str, percent: int, destination: str, **extra) -> dict:
        return {
            "EndpointName": name,
            "Containers": [
                {
                    "ContainerHostname": "echo",
                    "Image": "python",
                    "ModelDataUrl": str(handlers["echo"]),
                    "Resources": TINY,
                }
            ],
            "DataCaptureConfig": {
                "InitialSamplingPercentage": percent,
                "DestinationS3Uri": destination,
                "CaptureOptions": options,
                **extra,
            },
        }

    return [
        endpoint("it-capture", 100, f"file://{root / 'all'}"),
        endpoint("it-capture-sampled", 30, f"s3://{CAPTURE_BUCKET}/monitoring", S3EndpointUrl=s3_url),
        endpoint("it-capture-blocked", 100, str(root / "blocked")),
    ]


def metrics_endpoint_spec(demo: Path, prefix: Path) -> dict:
    """it-metrics: the endpoint only the metrics test invokes, so it can predict every count."""
    return {
        "EndpointName": "it-metrics",
        "Containers": [
            {
                "ContainerHostname": "multi",
                "Image": "sklearn",
                "Mode": "MultiModel",
                "ModelDataUrl": str(prefix),
                "Environment": {"SERVING_MAX_MODELS": "2"},
                "Resources": TINY,
            },
            {
                "ContainerHostname": "single",
                "Image": "sklearn",
                "ModelDataUrl": str(demo / "iris-classifier"),
                "Resources": TINY,
            },
        ],
    }


# it-scale: two containers with the same short-cooldown target tracking; the autoscaling test loads one.
SCALE_TARGET_PER_MINUTE = 120


def scaling_endpoint_spec(handlers: dict[str, Path]) -> dict:
    policy = {
        "MinCapacity": 1,
        "MaxCapacity": 3,
        "TargetTrackingScalingPolicyConfiguration": {
            "TargetValue": SCALE_TARGET_PER_MINUTE,
            "ScaleOutCooldown": 5,
            "ScaleInCooldown": 10,
        },
    }
    return {
        "EndpointName": "it-scale",
        "Containers": [
            {
                "ContainerHostname": name,
                "Image": "python",
                "ModelDataUrl": str(handlers["echo"]),
                "Resources": TINY,
                "AutoScaling": policy,
            }
            for name in ("busy", "quiet")
        ],
    }


# it-tfs (tests/integration/test_sagemaker_tfs.py): SageMaker TensorFlow Serving container scripts in the style
# of AWS's examples, on TF Serving's half_plus_three: `io` (input_handler turning CSV into "instances",
# output_handler returning response.content) and `posting` (handler posting to context.rest_uri with requests).
TFS_PROCESS = """
import json
import requests

def input_handler(data, context):
    if context.request_content_type == 'application/json':
        d = data.read().decode('utf-8')
        return d if len(d) else ''
    if context.request_content_type == 'text/csv':
        return json.dumps({'instances': [float(x) for x in data.read().decode('utf-8').split(',')]})
    raise ValueError('{{"error": "unsupported content type {}"}}'.format(context.request_content_type or 'unknown'))

def output_handler(data, context):
    if data.status_code != 200:
        raise ValueError(data.content.decode('utf-8'))
    return data.content, context.accept_header
"""
TFS_SCRIPTS = {
    "io": TFS_PROCESS,
    "posting": TFS_PROCESS.replace("def input_handler", "def _process_input").replace(
        "def output_handler", "def _process_output"
    )
    + "\ndef handler(data, context):\n"
    "    response = requests.post(context.rest_uri, data=_process_input(data, context))\n"
    "    return _process_output(response, context)\n",
}


@pytest.fixture(scope="session")
def tfs_models(tmp_path_factory) -> dict[str, Path]:
    """Two copies of a half_plus_three SavedModel (SageMaker's <model>/<version>/ layout), one per script."""
    from tests.unit.test_tfs_shapes import save_half_plus_three

    root = tmp_path_factory.mktemp("tfs")
    folders = {}
    for name, script in TFS_SCRIPTS.items():
        folders[name] = save_half_plus_three(root / name)
        (folders[name] / "code").mkdir()
        (folders[name] / "code" / "inference.py").write_text(script)
    return folders


def tfs_endpoint_spec(models: dict[str, Path]) -> dict:
    return {
        "EndpointName": "it-tfs",
        "Containers": [
            {"ContainerHostname": name, "Image": "tensorflow", "ModelDataUrl": str(folder), "Resources": TINY}
            for name, folder in models.items()
        ],
    }


# it-xgboost (tests/integration/test_xgboost_endpoint.py): a model.tar.gz as SageMaker's XGBoost algorithm writes it.
@pytest.fixture(scope="session")
def xgboost_model(tmp_path_factory) -> tuple[Path, object, object]:
    """(archive, booster, rows): a binary:logistic booster on breast cancer saved as `xgboost-model` at the root
    of `model.tar.gz`, and the rows it was trained on."""
    import tarfile
    import warnings

    from tests.unit.test_xgboost_stack import train_booster

    booster, rows = train_booster("binary")
    root = tmp_path_factory.mktemp("xgboost-algorithm")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Saving model in the UBJSON format as default": as the algorithm does
        booster.save_model(str(root / "xgboost-model"))
    archive = root / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root / "xgboost-model", arcname="xgboost-model")
    return archive, booster, rows


def xgboost_endpoint_spec(archive: Path) -> dict:
    return {
        "EndpointName": "it-xgboost",
        "Containers": [
            {"ContainerHostname": "algorithm", "Image": "xgboost", "ModelDataUrl": str(archive), "Resources": TINY}
        ],
    }


def _small(specs: list[dict]) -> list[dict]:
    # ~35 replicas share the session's 2 logical CPUs: reserve a small share each.
    for spec in specs:
        for container in spec["Containers"]:
            container.setdefault("Resources", {"Cpus": 0.04})
    return specs


# Scripts written the way AWS's examples write them, for it-sagemaker (tests/integration/test_sagemaker_scripts.py).
SKLEARN_MODEL_FN_ONLY = '''
import os

from skops.io import load


def model_fn(model_dir):
    """Load the model (the scikit-learn container's defaults do the rest)."""
    return load(os.path.join(model_dir, "model.skops"))
'''

PROGRAM_WITH_TRANSFORM_FN = """
import json

from weights import WEIGHTS


def model_fn(model_dir, context):
    return {"weights": WEIGHTS, "model_dir_is_str": isinstance(model_dir, str),
            "gpu_id": context.system_properties.get("gpu_id")}


def transform_fn(model, request_body, request_content_type, response_content_type, context):
    rows = json.loads(request_body)
    scores = [sum(w * x for w, x in zip(model["weights"], row)) for row in rows]
    attributes = context.get_request_header(0, "X-Amzn-SageMaker-Custom-Attributes")
    if attributes == "fail=teapot":
        context.set_response_status(418, "I am a teapot")
        return "refused by the script", "text/plain"
    body = {"scores": scores, "body_type": type(request_body).__name__, "attributes": attributes, **model}
    return json.dumps(body), response_content_type
"""


@pytest.fixture(scope="session")
def sagemaker_script_models(demo_models, tmp_path_factory) -> dict[str, Path]:
    """Model folders with SageMaker-style scripts: a scikit-learn model_fn, a SAGEMAKER_PROGRAM with transform_fn."""
    import shutil

    root = tmp_path_factory.mktemp("sagemaker-scripts")
    sklearn = root / "sklearn-script"
    shutil.copytree(demo_models / "iris-classifier", sklearn)
    (sklearn / "code").mkdir(exist_ok=True)
    (sklearn / "code" / "inference.py").write_text(SKLEARN_MODEL_FN_ONLY)
    program = root / "program"
    (program / "code").mkdir(parents=True)
    (program / "code" / "serve.py").write_text(PROGRAM_WITH_TRANSFORM_FN)
    (program / "code" / "weights.py").write_text("WEIGHTS = [1.0, 10.0, 100.0]\n")
    return {"sklearn": sklearn, "program": program}


def sagemaker_scripts_spec(models: dict[str, Path]) -> dict:
    return {
        "EndpointName": "it-sagemaker",
        "Containers": [
            {
                "ContainerHostname": "sk-script",
                "Image": "sklearn",
                "ModelDataUrl": str(models["sklearn"]),
                "Resources": TINY,
            },
            {
                "ContainerHostname": "program",
                "Image": "python",
                "ModelDataUrl": str(models["program"]),
                "Resources": TINY,
                "Environment": {"SAGEMAKER_PROGRAM": "serve.py"},
            },
        ],
    }


class Server:
    """The running endpoint server: its URL and an HTTP client; its gRPC port's address and the CA that signed it."""

    def __init__(self, url: str, grpc_target: str = "", grpc_ca: Path | None = None) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=30)
        self.grpc_target, self.grpc_ca = grpc_target, grpc_ca

    def invoke(
        self,
        endpoint: str,
        body,
        *,
        target: str | None = None,
        content_type: str = "application/json",
        headers: dict | None = None,
    ) -> httpx.Response:
        all_headers = {"Content-Type": content_type, **(headers or {})}
        if target is not None:
            all_headers["X-Amzn-SageMaker-Target-Container-Hostname"] = target
        data = body if isinstance(body, (bytes, str)) else __import__("json").dumps(body)
        return self.http.post(f"/endpoints/{endpoint}/invocations", content=data, headers=all_headers)

    def describe(self, name: str) -> dict:
        return self.http.get(f"/endpoints/{name}").json()


# Every endpoint a module may name in ENDPOINTS, by the builder that makes it and the session fixtures that takes.
_BUILDERS = {
    "basic": (("demo_models", "handler_models"), endpoint_specs),
    "access": (("demo_models", "identities_file"), lambda demo, identities: [access_endpoint_spec(demo, identities)]),
    "hetero": (("hetero_models", "working_dir_model"), hetero_endpoint_specs),
    "multi": (("multi_model_prefix", "s3_models"), lambda prefix, url: [multi_model_spec(prefix, url)]),
    "metrics": (("demo_models", "multi_model_prefix"), lambda demo, prefix: [metrics_endpoint_spec(demo, prefix)]),
    "scaling": (("handler_models",), lambda handlers: [scaling_endpoint_spec(handlers)]),
    "scripts": (("sagemaker_script_models",), lambda models: [sagemaker_scripts_spec(models)]),
    "async": (("handler_models", "s3_models"), lambda handlers, url: [async_endpoint_spec(handlers, url)]),
    "capture": (("handler_models", "capture_root", "s3_models"), capture_endpoint_specs),
    "tfs": (("tfs_models",), lambda models: [tfs_endpoint_spec(models)]),
    "xgboost": (("xgboost_model",), lambda model: [xgboost_endpoint_spec(model[0])]),
}
CATALOGUE = {
    **dict.fromkeys(
        (
            "it-direct",
            "it-single",
            "it-serial",
            "it-handoff",
            "it-serial-fail",
            "it-broken",
            "it-chaos",
            "it-spare",
            "it-stream",
            "it-update",
            "it-hostile",
        ),
        "basic",
    ),
    "it-secure": "access",
    **dict.fromkeys(("it-fifteen", "it-hetero-serial", "it-hetero-serial-onnx", "it-runtime-env"), "hetero"),
    "it-multi": "multi",
    "it-metrics": "metrics",
    "it-scale": "scaling",
    "it-sagemaker": "scripts",
    "it-async": "async",
    "it-tfs": "tfs",
    "it-xgboost": "xgboost",
    **dict.fromkeys(("it-capture", "it-capture-sampled", "it-capture-blocked"), "capture"),
}
EXPECTED_TO_FAIL = {"it-broken"}  # its `broken` container's model never loads: the endpoint settles Failed


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key (PEM files): the session's gRPC port serves TLS."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    names = [x509.DNSName("localhost"), x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert, key_file = folder / "grpc-cert.pem", folder / "grpc-key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_file.chmod(0o600)
    return cert, key_file


@pytest.fixture(scope="session")
def ray_server(tmp_path_factory):
    """Embedded Ray and the endpoint server, with no endpoints (the modules' `server` fixtures deploy them); its
    gRPC port serves TLS with a certificate of this session's."""
    from serving.ray_wing import EmbeddedServer

    cert, key = self_signed_certificate(tmp_path_factory.mktemp("grpc-tls"))
    settings = ServerSettings(
        port=0,
        max_payload_mb=1.0,
        invocation_timeout_s=3.0,
        grpc_port=0,
        grpc_tls_cert=str(cert),
        grpc_tls_key=str(key),
    )
    # The gateway reads and writes it-async's objects with its own credentials: those of the environment
    # Ray starts with (the local S3 server accepts any).
    with pytest.MonkeyPatch.context() as environment:
        for key, value in AWS_TEST_ENVIRONMENT.items():
            environment.setenv(key, value)
        with EmbeddedServer([], settings, num_cpus=2, wait=False, ready_timeout_s=READY_TIMEOUT_S) as embedded:
            embedded.running = set()  # catalogue endpoints deployed now
            embedded.grpc_ca = cert
            yield embedded


def _documents(request, names: list[str]) -> list[dict]:
    """The catalogue's spec documents for `names`, built from the session fixtures their builders take."""
    documents = []
    for group in dict.fromkeys(CATALOGUE[name] for name in names):
        fixtures, build = _BUILDERS[group]
        built = build(*(request.getfixturevalue(fixture) for fixture in fixtures))
        documents += [document for document in built if document["EndpointName"] in names]
    return documents


@pytest.fixture(scope="module")
def server(request, ray_server):
    """The endpoint server with the endpoints this module names in ENDPOINTS, InService (or, it-broken, Failed)."""
    wanted = getattr(request.module, "ENDPOINTS", None)
    if wanted is None:
        pytest.fail(f"{request.module.__name__} uses the endpoint server: name the endpoints it uses in ENDPOINTS")
    unknown = [name for name in wanted if name not in CATALOGUE]
    assert not unknown, f"ENDPOINTS names endpoints the catalogue lacks: {unknown}"
    new = [name for name in wanted if name not in ray_server.running]
    if new:
        for document in _small(_documents(request, new)):
            ray_server.deploy(parse_spec(document))
        ray_server.running.update(new)
        readiness = ray_server.wait_ready(new)
        problems = readiness.pending + [name for name in readiness.failed if name not in EXPECTED_TO_FAIL]
        if problems:
            for name in new:  # a failed start fails this module only: the next ones start without it
                ray_server.delete(name)
                ray_server.running.discard(name)
            pytest.fail(f"endpoints not ready after {READY_TIMEOUT_S} s: {readiness.explain()}")
    running = Server(ray_server.url, f"127.0.0.1:{ray_server.settings.grpc_port}", ray_server.grpc_ca)
    yield running
    running.http.close()
    module = request.node.nodeid
    for name in wanted:
        if request.config.stash[_LAST_USER].get(name, module) == module and name in ray_server.running:
            ray_server.delete(name)
            ray_server.running.discard(name)
