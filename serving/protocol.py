"""The wire protocol, written once: every name and code that crosses a process boundary.

The server (gateway, model server, control routes) and the SDK both import these; nothing else
defines a header name, an error code, a media type or a container environment variable. Header names
are matched case-insensitively. No imports, so the SDK stays light.
"""

# --- InvokeEndpoint (SageMaker Runtime) -----------------------------------------------------------
TARGET_CONTAINER = "X-Amzn-SageMaker-Target-Container-Hostname"
TARGET_MODEL = "X-Amzn-SageMaker-Target-Model"
TARGET_VARIANT = "X-Amzn-SageMaker-Target-Variant"
CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
INFERENCE_ID = "X-Amzn-SageMaker-Inference-Id"
INVOKED_VARIANT = "x-Amzn-Invoked-Production-Variant"
# Set on an invocation's answer while tracing is on (`serving.tracing`): the 32 hex digits of its
# OpenTelemetry trace id, to find the trace (and the log lines) of one request.
TRACE_ID = "X-Serving-Trace-Id"
# SageMaker's name for the one production variant of an endpoint.
DEFAULT_VARIANT = "AllTraffic"
# Custom attributes are limited to 1024 visible ASCII characters by SageMaker.
MAX_CUSTOM_ATTRIBUTES = 1024
MAX_INFERENCE_ID = 64
# SageMaker's pattern for EndpointName and ContainerHostname.
NAME_PATTERN = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"
# --- InvokeEndpointAsync (SageMaker Runtime): the input is an S3 object, the answer an S3 object
# ------------
ASYNC_INVOCATIONS_PATH = "/endpoints/{name}/async-invocations"
# the input's content type (not the HTTP Content-Type)
ASYNC_CONTENT_TYPE = "X-Amzn-SageMaker-Content-Type"
ASYNC_ACCEPT = "X-Amzn-SageMaker-Accept"
INPUT_LOCATION = "X-Amzn-SageMaker-InputLocation"
OUTPUT_PATH_EXTENSION = "X-Amzn-SageMaker-S3OutputPathExtension"
OUTPUT_FILENAME = "X-Amzn-SageMaker-Filename"
REQUEST_TTL = "X-Amzn-SageMaker-RequestTTLSeconds"
INVOCATION_TIMEOUT = "X-Amzn-SageMaker-InvocationTimeoutSeconds"
OUTPUT_LOCATION = "X-Amzn-SageMaker-OutputLocation"
FAILURE_LOCATION = "X-Amzn-SageMaker-FailureLocation"
# SageMaker's bounds: InputLocation, the inline Body, RequestTTLSeconds and
# InvocationTimeoutSeconds.
MAX_INPUT_LOCATION = 1024
MAX_ASYNC_BODY = 128_000
REQUEST_TTL_RANGE, DEFAULT_REQUEST_TTL = (60, 21_600), 21_600
INVOCATION_TIMEOUT_RANGE, DEFAULT_INVOCATION_TIMEOUT = (1, 3_600), 900
# Where SageMaker writes an answer and a failure, under the endpoint config's S3OutputPath /
# S3FailurePath.
OUTPUT_SUFFIX, FAILURE_SUFFIX = ".out", "-error.out"
# Set by a MultiModel container on any answer for a TargetModel it resolved to a model (loaded it,
# or found it loaded): the router labels metrics with a model name only then.
MODEL_RESOLVED = "X-Serving-Model-Resolved"
# Set by a container on an error answer that is the platform's refusal, not its model's (a
# MultiModel TargetModel that does not exist): the router reports only those as they are; every
# other error answer is a ModelError.
PLATFORM_ERROR = "X-Serving-Platform-Error"
# Set by a container on its error answers: where its process's output goes (the ModelError's
# LogStreamArn).
LOG_STREAM = "X-Serving-Log-Stream"

# --- InvokeEndpointWithResponseStream -------------------------------------------------------------
# the stream's Accept (InvokeEndpoint uses the plain header)
STREAM_ACCEPT = "X-Amzn-SageMaker-Accept"
# the model's content type (the body is the event stream)
STREAM_CONTENT_TYPE = "X-Amzn-SageMaker-Content-Type"
# Headers of the operation that this server does not support: refused, naming the parameter.
STREAM_UNSUPPORTED = {
    "X-Amzn-SageMaker-Inference-Component": "InferenceComponentName",
    "X-Amzn-SageMaker-Session-Id": "SessionId",
    "X-Amzn-SageMaker-Prefix-Aware-Id": "PrefixAwareId",
}
EVENT_STREAM = "application/vnd.amazon.eventstream"
# The SageMaker Runtime operations, by the last segment of their path (POST
# /endpoints/{EndpointName}/<segment>): an unknown path or method is answered with an
# UnknownOperationException that names the operation it resembles.
RUNTIME_OPERATIONS = {
    "invocations": "InvokeEndpoint",
    "invocations-response-stream": "InvokeEndpointWithResponseStream",
    "async-invocations": "InvokeEndpointAsync",
}
STREAM_PAYLOAD_EVENT = "PayloadPart"
STREAM_MODEL_ERROR_EVENT = "ModelStreamError"
STREAM_FAILURE_EVENT = "InternalStreamFailure"
STREAM_ERROR_CODE = "ErrorCode"  # ModelStreamError's field, with one of the codes below
# SageMaker's: the stream outlasted its time limit
STREAM_TIMEOUT_CODE = "ModelInvocationTimeExceeded"
# SageMaker's: the connection to the container was reset or closed
STREAM_BROKEN_CODE = "StreamBroken"
# (a generator that raises after its first part: ErrorCode.MODEL_ERROR)

# --- Open Inference Protocol (V2; KServe's and Triton's inference API) ----------------------------
V2_PREFIX = "/v2"
MODEL_NAME_SEPARATOR = "."  # `<endpoint>.<container>`: neither name may contain it (NAME_PATTERN)
# the binary tensor extension: JSON header, then raw tensors
V2_HEADER_LENGTH = "Inference-Header-Content-Length"
# Each V2 datatype and the NumPy dtype that carries it ("object": a BYTES tensor's elements, bytes
# each).
V2_DATATYPES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "object",
}
V2_EXTENSIONS = ("binary_tensor_data", "model_repository")  # what GET /v2 says this server supports
# the gRPC service's full name: its methods' path prefix
V2_GRPC_SERVICE = "inference.GRPCInferenceService"

# --- media types ----------------------------------------------------------------------------------
JSON = "application/json"
CSV = "text/csv"
NPY = "application/x-npy"
OCTET_STREAM = "application/octet-stream"
# JSON documents one per line, as SageMaker's TensorFlow Serving container reads them (both
# spellings).
JSON_LINES, JSONS = "application/jsonlines", "application/jsons"
SERVER_SENT_EVENTS = "text/event-stream"  # server-sent events: TGI's token stream, OpenAI's stream
# What the gateway's OpenAI-compatible routes send a generating container (the huggingface stack).
OPENAI_CHAT = "application/vnd.serving.openai.chat+json"
OPENAI_COMPLETIONS = "application/vnd.serving.openai.completions+json"
# Sparse rows (`label idx:value ...`), both spellings, as SageMaker's XGBoost container reads them.
LIBSVM, X_LIBSVM = "text/libsvm", "text/x-libsvm"
# SageMaker's RecordIO-wrapped protobuf `Record`s (the XGBoost stack refuses it: 415,
# containers/xgboost/README.md).
RECORDIO_PROTOBUF = "application/x-recordio-protobuf"

# --- errors: a JSON body {"__type": code, "message": ..., extra fields} and the code in this header
# -------
ERROR_TYPE_HEADER = "x-amzn-ErrorType"


class ErrorCode:
    """The error codes the server sends (botocore reads them as `Error.Code`)."""

    VALIDATION = "ValidationError"
    ACCESS_DENIED = "AccessDeniedException"
    UNRECOGNIZED_CLIENT = "UnrecognizedClientException"
    INVALID_SIGNATURE = "InvalidSignatureException"
    MISSING_AUTHENTICATION_TOKEN = "MissingAuthenticationTokenException"
    MODEL_ERROR = "ModelError"
    MODEL_NOT_READY = "ModelNotReadyException"
    UNKNOWN_OPERATION = "UnknownOperationException"
    THROTTLING = "ThrottlingException"
    REQUEST_TIMEOUT = "RequestTimeout"
    SERVICE_UNAVAILABLE = "ServiceUnavailable"
    INTERNAL_FAILURE = "InternalFailure"
    # The control-plane API's (SageMaker and Application Auto Scaling, JSON protocol).
    API_VALIDATION = "ValidationException"
    RESOURCE_NOT_FOUND = "ResourceNotFound"
    RESOURCE_IN_USE = "ResourceInUse"
    RESOURCE_LIMIT_EXCEEDED = "ResourceLimitExceeded"
    OBJECT_NOT_FOUND = "ObjectNotFoundException"
    UNKNOWN_API_OPERATION = "UnknownOperationException"
    # CloudWatch's (code sent in QUERY_ERROR_HEADER; the body's __type is the error shape's name).
    INVALID_PARAMETER_VALUE = "InvalidParameterValue"
    INVALID_PARAMETER_COMBINATION = "InvalidParameterCombination"
    MISSING_PARAMETER = "MissingParameter"
    LIMIT_EXCEEDED = "LimitExceeded"
    INVALID_NEXT_TOKEN = "InvalidNextToken"
    INVALID_FORMAT = "InvalidFormat"


# The status each code is sent with (ValidationError also as 431 when the request head is too
# large).
ERROR_STATUS = {
    ErrorCode.VALIDATION: 400,
    ErrorCode.ACCESS_DENIED: 403,
    ErrorCode.UNRECOGNIZED_CLIENT: 403,
    ErrorCode.INVALID_SIGNATURE: 403,
    ErrorCode.MISSING_AUTHENTICATION_TOKEN: 403,
    ErrorCode.MODEL_ERROR: 424,
    ErrorCode.MODEL_NOT_READY: 429,
    ErrorCode.UNKNOWN_OPERATION: 404,
    ErrorCode.THROTTLING: 429,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.SERVICE_UNAVAILABLE: 503,
    ErrorCode.INTERNAL_FAILURE: 500,
    ErrorCode.API_VALIDATION: 400,
    ErrorCode.RESOURCE_NOT_FOUND: 400,
    ErrorCode.RESOURCE_IN_USE: 400,
    ErrorCode.RESOURCE_LIMIT_EXCEEDED: 400,
    ErrorCode.OBJECT_NOT_FOUND: 400,
    ErrorCode.INVALID_PARAMETER_VALUE: 400,
    ErrorCode.INVALID_PARAMETER_COMBINATION: 400,
    ErrorCode.MISSING_PARAMETER: 400,
    ErrorCode.LIMIT_EXCEEDED: 400,
    ErrorCode.INVALID_NEXT_TOKEN: 400,
    ErrorCode.INVALID_FORMAT: 400,
}
HEADERS_TOO_LARGE_STATUS = 431
# A container's status for a content type or Accept its decoders lack (the toolkits'
# UnsupportedFormatError).
UNSUPPORTED_MEDIA_TYPE_STATUS = 415
# ModelError's extra fields: what the failing container answered.
ORIGINAL_STATUS_CODE, ORIGINAL_MESSAGE, CONTAINER_HOSTNAME = (
    "OriginalStatusCode",
    "OriginalMessage",
    "ContainerHostname",
)
LOG_STREAM_ARN = "LogStreamArn"  # ModelError's field: where the failing container's logs are

# --- the control-plane API (SageMaker's and Application Auto Scaling's JSON protocol, POST /) -----
AMZ_TARGET = "X-Amz-Target"  # <prefix>.<Operation>
SAGEMAKER_TARGET_PREFIX = "SageMaker"
AUTOSCALING_TARGET_PREFIX = "AnyScaleFrontendService"
AMZ_JSON = "application/x-amz-json-1.1"
# The signing name (SigV4 credential scope) and IAM prefix of SageMaker (both APIs) and Application
# Auto Scaling.
SIGNING_SERVICE = "sagemaker"
AUTOSCALING_SERVICE = "application-autoscaling"
# Separates an API endpoint's name from its variant's in the name of the endpoint that serves the
# variant.
VARIANT_SEPARATOR = "@"

# --- CloudWatch's API (the pinned botocore's client speaks awsJson 1.0 with query-compatible
# errors) ---------
CLOUDWATCH_TARGET_PREFIX = "GraniteServiceVersion20100801"
AMZ_JSON_1_0 = "application/x-amz-json-1.0"
# its SigV4 scope; its IAM actions are `cloudwatch:<Operation>`
CLOUDWATCH_SIGNING_SERVICE = "monitoring"
CLOUDWATCH_IAM_PREFIX = "cloudwatch"
# "<query-protocol code>;Sender": how botocore finds the modeled error
QUERY_ERROR_HEADER = "x-amzn-query-error"
SAGEMAKER_NAMESPACE = "AWS/SageMaker"  # invocation metrics
# CPU and memory utilization, as SageMaker files them
ENDPOINTS_NAMESPACE = "/aws/sagemaker/Endpoints"
API_SIGNING_SERVICES = {
    SAGEMAKER_TARGET_PREFIX: SIGNING_SERVICE,
    AUTOSCALING_TARGET_PREFIX: AUTOSCALING_SERVICE,
    CLOUDWATCH_TARGET_PREFIX: CLOUDWATCH_SIGNING_SERVICE,
}
# Each service's IAM action prefix (`<prefix>:<Operation>`), where it differs from its signing name.
API_IAM_PREFIXES = {**API_SIGNING_SERVICES, CLOUDWATCH_TARGET_PREFIX: CLOUDWATCH_IAM_PREFIX}

# --- the operator console (docs/console.md; its Content-Security-Policy: console/page.py) -----------
CONSOLE_PATH, CONSOLE_ASSET_PATH = "/console", "/console/assets/{name}"
CONSOLE_OVERVIEW_PATH = "/console/api/overview"
CONSOLE_ENDPOINT_PATH = "/console/api/endpoints/{name}"
HTML, JAVASCRIPT, STYLESHEET = "text/html; charset=utf-8", "text/javascript", "text/css"
CONTENT_SECURITY_POLICY_HEADER = "content-security-policy"
CONTENT_TYPE_OPTIONS_HEADER, NO_SNIFF = "x-content-type-options", "nosniff"
REFERRER_POLICY_HEADER, NO_REFERRER = "referrer-policy", "no-referrer"
CACHE_CONTROL_HEADER, NO_STORE = "cache-control", "no-store"
AUTHENTICATE_HEADER, BASIC_SCHEME = "www-authenticate", "basic"
CONSOLE_CHALLENGE = 'Basic realm="serving console", charset="UTF-8"'

# --- gateway -> container hops (SageMaker's model-container contract, signed) ---------------------
INVOCATIONS_PATH = "/invocations"
PING_PATH = "/ping"
# the supervisor's read of its container's counters and metric events
STATS_PATH = "/_serving/stats"
# the gateway's read of a model's tensors (Open Inference metadata)
SIGNATURE_PATH = "/_serving/signature"
# A MultiModel container's models: GET lists them, POST .../load and .../unload with {"model": name}
# (V2 repository)
REPOSITORY_PATH = "/_serving/models"
# The tensorflow stack's TF Serving REST API for its own process's handlers (`context.rest_uri`),
# under a per-process secret token: LOCAL_TFS_PATH/<token>/v1/models/<name>:predict, loopback
# callers only.
LOCAL_TFS_PATH = "/_serving/tfs"
HOP_DATE_HEADER = "x-serving-hop-date"
HOP_SIGNATURE_HEADER = "x-serving-hop-signature"
# "true": answer with an event stream of the model's chunks (signed)
HOP_STREAM_HEADER = "x-serving-hop-stream"
# W3C Trace Context: the caller's to the gateway; the gateway's hop span to a container (signed)
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# A traced hop's answer: the container's steps with their times (`tracing.hop_steps`)
HOP_STEPS_HEADER = "x-serving-hop-steps"

# --- Ray: names the control plane's plans and the Ray wing share ----------------------------------
RAY_NAMESPACE = "serving"  # this project's actors and applications
# the routing table's actor (the autoscaling policy reports to it too)
REGISTRY_ACTOR = "serving-registry"

# --- a container's environment --------------------------------------------------------------------
# Set by the control plane from the spec; a container's `Environment` cannot override them.
CPUS_ENV = "SERVING_CPUS"  # Resources.Cpus: framework stacks size their thread pools from it
GPUS_ENV = "SERVING_GPUS"  # Resources.Gpus: the device a stack picks
MEMORY_ENV = "SERVING_MEMORY_MB"  # Resources.MemoryMb: the memory utilization metric's 100%
# the container's private scratch folder for unpacked models
MODEL_CACHE_DIR_ENV = "SERVING_MODEL_CACHE_DIR"
# Read from a container's `Environment` (documented in docs/spec.md).
MAX_CONCURRENCY_ENV = "SERVING_MAX_CONCURRENCY"  # per-replica in-flight bound
# "false": never send a request twice, even if no replica answered it
IDEMPOTENT_ENV = "SERVING_IDEMPOTENT"
MAX_MODELS_ENV = "SERVING_MAX_MODELS"  # MultiModel: models kept loaded (default 16)
# MultiModel: their measured memory (default: 80% of MemoryMb, if set)
MODEL_MEMORY_ENV = "SERVING_MODEL_CACHE_MB"
# MultiModel: downloaded and unpacked models on local disk (default 10240)
MODEL_DISK_ENV = "SERVING_MODEL_DISK_MB"
# MultiModel: an S3-compatible store for s3:// prefixes
S3_ENDPOINT_URL_ENV = "SERVING_S3_ENDPOINT_URL"
THREADS_ENV = "SERVING_NUM_THREADS"  # override of a tensor stack's intra-op thread count
# predictions run at once in one replica (its model thread pool)
MODEL_THREADS_ENV = "SERVING_MODEL_THREADS"
# a prediction this fast may run on the event loop (0: never)
INLINE_BUDGET_ENV = "SERVING_INLINE_BUDGET_MS"
# Dynamic batching (the spec's `Batching` sets them; a container's `Environment` may instead).
# rows merged into one predict_fn call (unset or 1: no batching)
MAX_BATCH_SIZE_ENV = "SERVING_MAX_BATCH_SIZE"
# how long the first queued request waits for company
MAX_BATCH_DELAY_ENV = "SERVING_MAX_BATCH_DELAY_MS"
# comma-separated sizes to cut batches at
PREFERRED_BATCH_SIZES_ENV = "SERVING_PREFERRED_BATCH_SIZES"
ALLOW_PICKLE_ENV = "SERVING_ALLOW_PICKLE"  # "true": load formats that run code when loaded
# predict | predict_proba | transform | decision_function
SKLEARN_METHOD_ENV = "SERVING_SKLEARN_METHOD"
# probability (default: the objective's output, as Booster.predict) | raw (raw_score=True)
LIGHTGBM_OUTPUT_ENV = "SERVING_LIGHTGBM_OUTPUT"
TF_SIGNATURE_ENV = "SERVING_TF_SIGNATURE"  # the SavedModel signature to call
# JSON {"inputs": [...], "outputs": [...]} ({"name", "datatype", "shape"} each): what Open Inference
# metadata says of a model whose stack cannot (a python container, a script) or says it otherwise
TENSOR_SIGNATURE_ENV = "SERVING_TENSOR_SIGNATURE"
# The huggingface stack: the Hugging Face toolkit's names, and the generation's bounds.
HF_TASK_ENV = "HF_TASK"  # the pipeline's task (else the config's architecture decides)
HF_MODEL_ID_ENV = "HF_MODEL_ID"  # a local folder only: no hub access
HF_TRUST_REMOTE_CODE_ENV = "HF_TRUST_REMOTE_CODE"  # "true": run a model folder's own Python
HF_MAX_NEW_TOKENS_ENV = "SERVING_HF_MAX_NEW_TOKENS"  # the most tokens a request may ask for
HF_CONTINUOUS_BATCHING_ENV = "SERVING_HF_CONTINUOUS_BATCHING"  # "false": each request alone
HF_MAX_BATCH_ENV = "SERVING_HF_MAX_BATCH"  # requests decoding together (streams held open)
SKOPS_TRUSTED_TYPES_ENV = "SERVING_SKOPS_TRUSTED_TYPES"  # comma-separated exact type names
SANDBOX_READ_ENV = "SERVING_SANDBOX_READ"  # os.pathsep-separated paths the container may also read
# ... and write (both: a spec's author only, never an API caller)
SANDBOX_WRITE_ENV = "SERVING_SANDBOX_WRITE"
# What a container's `Environment` may not set: read as a process starts (by the dynamic loader,
# glibc, the Python interpreter or a shell), each chooses code to run or files to load before
# anything of ours runs. Refused by name when a spec or a CreateModel call is validated, and never
# passed to a container process either way.
STARTUP_VARIABLE_PREFIXES = ("LD_", "DYLD_", "PYTHON")
STARTUP_VARIABLES = frozenset(
    {
        # glibc's list of variables it ignores for setuid programs (sysdeps/generic/unsecvars.h)
        "GCONV_PATH",
        "GETCONF_DIR",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "MALLOC_TRACE",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TMPDIR",
        "TZDIR",
        # shells and other interpreters a model's code may start
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "PERL5LIB",
        "PERL5OPT",
        "PERLLIB",
        "RUBYLIB",
        "RUBYOPT",
        "NODE_OPTIONS",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        # OpenSSL loads engines, providers and whatever its configuration names
        "OPENSSL_CONF",
        "OPENSSL_ENGINES",
        "OPENSSL_MODULES",
        "HOME",
    }
)
# PYTHON* variables that choose no code (the container process runs `python -I`, which reads none of
# them; a subprocess of the model's may): accepted, as SageMaker examples set PYTHONUNBUFFERED.
HARMLESS_PYTHON_VARIABLES = frozenset(
    {
        "PYTHONUNBUFFERED",
        "PYTHONHASHSEED",
        "PYTHONIOENCODING",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONUTF8",
    }
)
# SageMaker's: the Accept a hop gets when none is given
DEFAULT_ACCEPT_ENV = "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT"
PROGRAM_ENV = "SAGEMAKER_PROGRAM"  # SageMaker's: the handler script (default inference.py)
# SageMaker's: the folder holding it (default <model>/code)
SUBMIT_DIRECTORY_ENV = "SAGEMAKER_SUBMIT_DIRECTORY"
TFS_MODEL_NAME_ENV = "SAGEMAKER_TFS_DEFAULT_MODEL_NAME"
# SageMaker TFS container's: seconds its handlers wait for TF Serving (`context.timeout`)
TFS_WAIT_TIME_ENV = "SAGEMAKER_TFS_WAIT_TIME_SECONDS"
# SageMaker XGBoost container's: the fields of each answer (predicted_label, probability,
# probabilities, ...).
INFERENCE_OUTPUT_ENV = "SAGEMAKER_INFERENCE_OUTPUT"
# SageMaker XGBoost container's: "false" serves only the first of several boosters (k-fold
# xgboost-model-N files).
# SageMaker TFS container's: the model name rest_uri names
INFERENCE_ENSEMBLE_ENV = "SAGEMAKER_INFERENCE_ENSEMBLE"
