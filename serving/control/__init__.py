"""The control plane's pure logic: a spec as the registry's record and each container's plan
(`plans`), desired to active container versions, blue/green, reverted on failure
(`container_versions`), health by replica and descriptions (`status`), versions on container hosts
(`hosted_apps`). The Ray wing executes it;
nothing here imports Ray.

Modules: `plans` (a spec as the registry's record and each container's plan), `container_versions`
(blue/green steps toward a desired record, one container version at a time), `runtime_env` (a
container's process environment and Ray runtime_env), `requirements` (a model's
code/requirements.txt at deploy time), `status` (descriptions and /ping), `records` (the plan and
the registry's record, typed for mypy), `snapshots` (the registry's state as the one snapshot every
gateway reads), `snapshot_feed` (the registry's snapshots to every gateway over signed HTTP),
`hosted_apps` (a version's replicas on their nodes' container hosts: slots and status).
"""
