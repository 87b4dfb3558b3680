"""The requests of CloudWatch's API that this server answers, validated with CloudWatch's own
limits.

A field CloudWatch has but this server does not support (metric math, anomaly detection, composite
alarms' filters) is not a field here, so the request is refused with InvalidParameterValue naming
it; a missing required field is MissingParameter, as CloudWatch answers.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic import ValidationError as PydanticValidationError

from serving.cloudwatch.alarms import COMPARISONS, STATES, TREATMENTS
from serving.cloudwatch.api_errors import (
    InvalidParameterCombinationError,
    InvalidParameterValueError,
    MissingParameterError,
)
from serving.cloudwatch.catalogue import METRICS, NAMESPACES, source
from serving.cloudwatch.datapoints import PERIODS_HELP, valid_period
from serving.cloudwatch.statistics import PERCENTILE, STATISTICS
from serving.documents import field_path

Text = Annotated[str, Field(min_length=1, max_length=255)]
StatisticName = Literal["SampleCount", "Average", "Sum", "Minimum", "Maximum"]
Percentile = Annotated[str, Field(pattern=PERCENTILE.pattern)]
Comparison = Literal[
    "GreaterThanOrEqualToThreshold",
    "GreaterThanThreshold",
    "LessThanThreshold",
    "LessThanOrEqualToThreshold",
]
State = Literal["OK", "ALARM", "INSUFFICIENT_DATA"]
Treatment = Literal["breaching", "notBreaching", "ignore", "missing"]
assert (tuple(COMPARISONS), STATES, TREATMENTS) == (
    get_args(Comparison),
    get_args(State),
    get_args(Treatment),
)
assert STATISTICS == get_args(StatisticName)


class Shape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Dimension(Shape):
    Name: Text
    Value: Text


class DimensionFilter(Shape):
    Name: Text
    Value: Text | None = None


class PutMetricAlarmInput(Shape):
    AlarmName: Text
    AlarmDescription: Annotated[str, Field(max_length=1024)] | None = None
    ActionsEnabled: bool = True
    OKActions: Annotated[list[Text], Field(max_length=5)] = []
    AlarmActions: Annotated[list[Text], Field(max_length=5)] = []
    InsufficientDataActions: Annotated[list[Text], Field(max_length=5)] = []
    MetricName: Text
    Namespace: Text
    Statistic: StatisticName | None = None
    ExtendedStatistic: Percentile | None = None
    Dimensions: Annotated[list[Dimension], Field(max_length=30)] = []
    Period: Annotated[int, Field(ge=1)]
    Unit: str | None = None
    EvaluationPeriods: Annotated[int, Field(ge=1)]
    DatapointsToAlarm: Annotated[int, Field(ge=1)] | None = None
    Threshold: float
    ComparisonOperator: Comparison
    TreatMissingData: Treatment = "missing"
    Tags: list[dict[str, str]] = []

    @model_validator(mode="after")
    def _one_statistic(self) -> PutMetricAlarmInput:
        if (self.Statistic is None) == (self.ExtendedStatistic is None):
            raise InvalidParameterCombinationError(
                "PutMetricAlarm: give exactly one of Statistic and ExtendedStatistic"
            )
        if self.DatapointsToAlarm is not None and self.DatapointsToAlarm > self.EvaluationPeriods:
            raise InvalidParameterValueError("DatapointsToAlarm must be at most EvaluationPeriods")
        return self


class DescribeAlarmsInput(Shape):
    AlarmNames: Annotated[list[Text], Field(max_length=100)] = []
    AlarmNamePrefix: Text | None = None
    AlarmTypes: list[Literal["MetricAlarm", "CompositeAlarm"]] = []
    StateValue: State | None = None
    ActionPrefix: Text | None = None
    MaxRecords: Annotated[int, Field(ge=1, le=100)] = 50
    NextToken: str | None = None


class DeleteAlarmsInput(Shape):
    AlarmNames: Annotated[list[Text], Field(max_length=100)]


class SetAlarmStateInput(Shape):
    AlarmName: Text
    StateValue: State
    StateReason: Annotated[str, Field(max_length=1023)]
    StateReasonData: Annotated[str, Field(max_length=4000)] | None = None


class DescribeAlarmHistoryInput(Shape):
    AlarmName: Text | None = None
    AlarmTypes: list[Literal["MetricAlarm", "CompositeAlarm"]] = []
    HistoryItemType: Literal["ConfigurationUpdate", "StateUpdate", "Action"] | None = None
    StartDate: float | None = None
    EndDate: float | None = None
    MaxRecords: Annotated[int, Field(ge=1, le=100)] = 100
    NextToken: str | None = None
    ScanBy: Literal["TimestampDescending", "TimestampAscending"] = "TimestampDescending"


class GetMetricStatisticsInput(Shape):
    Namespace: Text
    MetricName: Text
    Dimensions: Annotated[list[Dimension], Field(max_length=30)] = []
    StartTime: float
    EndTime: float
    Period: Annotated[int, Field(ge=1)]
    Statistics: Annotated[list[StatisticName], Field(min_length=1, max_length=5)] | None = None
    ExtendedStatistics: Annotated[list[Percentile], Field(min_length=1, max_length=10)] | None = (
        None
    )
    Unit: str | None = None

    @model_validator(mode="after")
    def _statistics(self) -> GetMetricStatisticsInput:
        if not self.Statistics and not self.ExtendedStatistics:
            raise MissingParameterError(
                "GetMetricStatistics: Statistics or ExtendedStatistics is required"
            )
        return self


class MetricShape(Shape):
    Namespace: Text
    MetricName: Text
    Dimensions: Annotated[list[Dimension], Field(max_length=30)] = []


class MetricStatShape(Shape):
    Metric: MetricShape
    Period: Annotated[int, Field(ge=1)]
    Stat: Text
    Unit: str | None = None


class MetricDataQuery(Shape):
    Id: Annotated[str, Field(pattern=r"^[a-z][a-zA-Z0-9_]{0,254}$")]
    # metric math (Expression) is not supported: refused as an unknown field
    MetricStat: MetricStatShape
    Label: str | None = None
    ReturnData: bool = True
    Period: int | None = None


class GetMetricDataInput(Shape):
    MetricDataQueries: Annotated[list[MetricDataQuery], Field(min_length=1, max_length=500)]
    StartTime: float
    EndTime: float
    NextToken: str | None = None
    ScanBy: Literal["TimestampDescending", "TimestampAscending"] = "TimestampDescending"
    MaxDatapoints: Annotated[int, Field(ge=1)] = 100_800


class ListMetricsInput(Shape):
    Namespace: Text | None = None
    MetricName: Text | None = None
    Dimensions: Annotated[list[DimensionFilter], Field(max_length=10)] = []
    NextToken: str | None = None
    RecentlyActive: Literal["PT3H"] | None = None


S = TypeVar("S", bound=Shape)


def parse(shape: type[S], document: Any, operation: str) -> S:
    """`document` as `shape`, or CloudWatch's error naming the field at fault."""
    try:
        return shape.model_validate(document)
    except PydanticValidationError as error:
        problems = error.errors(include_url=False)
        unsupported = [
            field_path(item["loc"]) for item in problems if item["type"] == "extra_forbidden"
        ]
        # first: a field this server lacks explains the rest (metric math has no MetricStat)
        if unsupported:
            raise InvalidParameterValueError(
                f"{operation}: {unsupported[0]} is not supported by this server (docs/cloudwatch.md lists what is)"
            ) from None
        missing = [field_path(item["loc"]) for item in problems if item["type"] == "missing"]
        if missing:
            raise MissingParameterError(
                f"{operation}: the parameter {missing[0]} is required."
            ) from None
        item = problems[0]
        path = field_path(item["loc"], root=operation)
        raise InvalidParameterValueError(
            f"{operation}: {path}: {item['msg'].removeprefix('Value error, ')}"
        ) from None


# --- values checked against what this server keeps

MAX_DATAPOINTS = 1440  # GetMetricStatistics' limit per call, as CloudWatch's


def check_namespace(namespace: str) -> None:
    if namespace not in NAMESPACES:
        raise InvalidParameterValueError(
            f"Namespace {namespace!r}: this server keeps only {' and '.join(NAMESPACES)}, the metrics it measures "
            "itself; metrics of a namespace of your own are out of scope (docs/cloudwatch.md)"
        )


def catalogued(namespace: str, metric: str, known_only: bool = True) -> Any:
    """The catalogue's metric (an alarm needs one that exists; a query of another name just has no
    data)."""
    check_namespace(namespace)
    found = source(namespace, metric)
    if found is None and known_only:
        names = ", ".join(name for name, kept in METRICS.items() if namespace in kept.namespaces)
        raise InvalidParameterValueError(f"MetricName {metric!r}: {namespace} has {names}")
    return found


def check_range(start: float, end: float, period: int, limit: int = MAX_DATAPOINTS) -> None:
    if not valid_period(period):
        raise InvalidParameterValueError(f"Period {period}: must be {PERIODS_HELP}")
    if end <= start:
        raise InvalidParameterValueError("StartTime must be before EndTime")
    if (end - start) / period > limit:
        raise InvalidParameterCombinationError(
            f"You have requested up to {int((end - start) / period)} datapoints, which exceeds the limit of {limit}."
        )
