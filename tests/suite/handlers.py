"""The handler scripts the Ray tiers serve (`code/inference.py` of a Python-stack model), one folder
each, made once per session: `handler_models[name]` is the model folder of `HANDLERS[name]`."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    # InvokeEndpointWithResponseStream: output_fn returns a generator of JSON lines, each stamped
    # with when it was made; {"count": N, "gap": S, "fail": K} makes N chunks S seconds apart and
    # raises before chunk K.
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
