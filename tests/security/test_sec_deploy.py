"""The cluster manifests in deploy/ keep Ray's authentication on and its dashboard off the
network."""

from __future__ import annotations

from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _documents(path: Path) -> list[dict]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def _env(containers: list[dict]) -> list[dict[str, object]]:
    return [
        {
            item["name"]: item.get("value", item.get("valueFrom"))
            for item in container.get("env", [])
        }
        for container in containers
    ]


def test_kuberay_pods_and_job_use_token_authentication() -> None:
    documents = _documents(DEPLOY / "kuberay" / "rayservice.yaml")
    cluster = next(d for d in documents if d["kind"] == "RayCluster")["spec"]
    job = next(d for d in documents if d["kind"] == "Job")["spec"]["template"]["spec"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    environments = [
        env for group in groups for env in _env(group["template"]["spec"]["containers"])
    ]
    environments += _env(job["containers"])
    for env in environments:
        assert env.get("RAY_AUTH_MODE") == "token"
        assert isinstance(env.get("RAY_AUTH_TOKEN"), dict), (
            "the token comes from a Secret, never inline"
        )
    head = cluster["headGroupSpec"]["rayStartParams"]
    assert head.get("dashboard-host", "127.0.0.1") in ("127.0.0.1", "localhost")


def test_cluster_launcher_config_uses_token_authentication() -> None:
    config = yaml.safe_load((DEPLOY / "ray-cluster.yaml").read_text())
    commands = " ".join(config["head_start_ray_commands"] + config["worker_start_ray_commands"])
    assert "--dashboard-host=0.0.0.0" not in commands
    assert "RAY_AUTH_MODE=token" in commands or "RAY_AUTH_MODE=token" in " ".join(
        config["docker"].get("run_options", [])
    )
    assert "RAY_AUTH_MODE=disabled" not in (DEPLOY / "ray-cluster.yaml").read_text()
