"""The errors CloudWatch's API answers: its own shapes and query-protocol codes, on the one wire
shape of `serving.errors`."""

from __future__ import annotations

from serving.errors import ErrorJson, ServingError
from serving.protocol import QUERY_ERROR_HEADER, ErrorCode


class CloudWatchError(ServingError):
    """An error of CloudWatch's API: its query-protocol code (botocore's `Error.Code`) travels in
    QUERY_ERROR_HEADER, the error shape's name in `__type`, as CloudWatch's awsJson answers send
    them."""

    code = ErrorCode.INVALID_PARAMETER_VALUE
    shape = "InvalidParameterValueException"
    status = 400

    def wire_headers(self) -> dict[str, str]:
        return {QUERY_ERROR_HEADER: f"{self.code};Sender"}

    def body(self) -> ErrorJson:
        return {"__type": self.shape, "message": self.message}


class InvalidParameterValueError(CloudWatchError):
    """A CloudWatch parameter with a value this server cannot accept (named in the message)."""


class InvalidParameterCombinationError(CloudWatchError):
    code, shape = ErrorCode.INVALID_PARAMETER_COMBINATION, "InvalidParameterCombinationException"


class MissingParameterError(CloudWatchError):
    code, shape = ErrorCode.MISSING_PARAMETER, "MissingRequiredParameterException"


class AlarmNotFoundError(CloudWatchError):
    code = shape = ErrorCode.RESOURCE_NOT_FOUND  # the error shape has the code's name
    status = 404


class AlarmLimitExceededError(CloudWatchError):
    code, shape = ErrorCode.LIMIT_EXCEEDED, "LimitExceededFault"


class InvalidFormatError(CloudWatchError):
    code, shape = ErrorCode.INVALID_FORMAT, "InvalidFormatFault"


class InvalidNextTokenError(CloudWatchError):
    code = shape = ErrorCode.INVALID_NEXT_TOKEN
