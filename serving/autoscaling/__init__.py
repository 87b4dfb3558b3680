"""Target tracking as SageMaker's Application Auto Scaling does it: the pure decision core
(`policy`) and the configuration a container's Serve deployment gets (`config`). The policy object
Serve's controller runs lives in the Ray wing (`serving.ray_wing.autoscaler`).
"""
