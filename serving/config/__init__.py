"""Config documents users write: the endpoint spec, the identities file and the policy documents share one
capability (`documents`): a strict pydantic base (unknown fields refused), one error shape naming the
field path, one rule for paths written in a document. The endpoint spec: `spec` (endpoint fields and
loading; every spec name is importable from it), `container` (a container's fields), `scaling` (autoscaling), `async_inference` (AsyncInferenceConfig).
No Ray, no web framework.
"""
