"""Target tracking as SageMaker's Application Auto Scaling does it: the pure decision core
(`policy`), the configuration a container's Serve deployment gets (`config`), and the look-back
averages of replicas Serve does not run (`windows`). The policy object Serve's controller, or the
registry for a container host's replicas, runs lives in the Ray wing
(`serving.ray_wing.autoscaler`, `serving.ray_wing.hosted_scaling`).
"""
