"""The control plane's pure logic: a spec as the registry's record and each container's plan (`plans`),
desired to active records with blue/green and rollback (`rollout`), health by replica and descriptions
(`status`). The Ray wing executes it; nothing here imports Ray.
"""
