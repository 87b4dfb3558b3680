"""Header names of the SageMaker Runtime InvokeEndpoint wire protocol."""

TARGET_CONTAINER = "x-amzn-sagemaker-target-container-hostname"
TARGET_MODEL = "x-amzn-sagemaker-target-model"
TARGET_VARIANT = "x-amzn-sagemaker-target-variant"
CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"
INFERENCE_ID = "x-amzn-sagemaker-inference-id"
INVOKED_VARIANT = "x-Amzn-Invoked-Production-Variant"
# SageMaker's name for the one production variant of an endpoint.
DEFAULT_VARIANT = "AllTraffic"
# Custom attributes are limited to 1024 visible ASCII characters by SageMaker.
MAX_CUSTOM_ATTRIBUTES = 1024
