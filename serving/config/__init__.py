"""The endpoint spec, a document users write (on `serving.documents`, which the identities file and
policy documents of `access` share: a strict pydantic base, one error shape, one rule for paths):
`spec` (endpoint fields and loading; every spec name is importable from it), `container` (a
container's fields), `placement` (its Ray resources and Python environment), `tensor_signature` (its
declared tensors), `scaling` (autoscaling), `async_inference` (AsyncInferenceConfig), `data_capture`
(DataCaptureConfig). No Ray, no web framework.
"""
