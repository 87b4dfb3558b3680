"""Header names of the SageMaker Runtime InvokeEndpoint wire protocol (matched case-insensitively)."""

TARGET_CONTAINER = "X-Amzn-SageMaker-Target-Container-Hostname"
TARGET_MODEL = "X-Amzn-SageMaker-Target-Model"
TARGET_VARIANT = "X-Amzn-SageMaker-Target-Variant"
CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
INFERENCE_ID = "X-Amzn-SageMaker-Inference-Id"
INVOKED_VARIANT = "x-Amzn-Invoked-Production-Variant"
# SageMaker's name for the one production variant of an endpoint.
DEFAULT_VARIANT = "AllTraffic"
# Custom attributes are limited to 1024 visible ASCII characters by SageMaker.
MAX_CUSTOM_ATTRIBUTES = 1024
MAX_INFERENCE_ID = 64
# SageMaker's pattern for EndpointName and ContainerHostname.
NAME_PATTERN = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"
# Set by a MultiModel container on any answer for a TargetModel it resolved to a model (loaded it, or
# found it loaded): the router labels metrics with a model name only then.
MODEL_RESOLVED = "X-Serving-Model-Resolved"
