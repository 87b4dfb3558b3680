"""The control plane's pure logic: a spec as the registry's record and each container's plan (`plans`),
desired to active records with blue/green and rollback (`rollout`), health by replica and descriptions
(`status`). The Ray wing executes it; nothing here imports Ray.

Modules: `plans` (a spec as the registry's record and each container's plan), `rollout` (blue/green steps toward a
desired record), `runtime_env` (a container's process environment and Ray runtime_env), `requirements` (a model's
code/requirements.txt at deploy time), `status` (descriptions and /ping), `records` (the plan and the registry's
record, typed for mypy).
"""
