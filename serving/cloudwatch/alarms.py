"""One metric alarm's evaluation: its last EvaluationPeriods periods against its threshold, as
CloudWatch decides it (DatapointsToAlarm of them breaching: ALARM; TreatMissingData for periods
without data), and the state reason CloudWatch writes. Run every RESOLUTION_S over the periods that
end at the latest datapoint. The reason shows the datapoints, so it is withheld from whoever may not
read the metric (`withheld`).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal, NotRequired, TypedDict

from serving.cloudwatch.statistics import Stat
from serving.documents import ApiJson

__all__ = [
    "COMPARISONS",
    "STATES",
    "TREATMENTS",
    "WITHHELD",
    "AlarmDocument",
    "AlarmHistory",
    "AlarmState",
    "evaluate",
    "withheld",
]

AlarmState = Literal["OK", "ALARM", "INSUFFICIENT_DATA"]


class AlarmDocument(TypedDict):
    """A metric alarm as the API's database keeps it and DescribeAlarms shows it: PutMetricAlarm's
    request (less its Tags) and its state."""

    AlarmName: str
    AlarmArn: str
    AlarmDescription: NotRequired[str]
    ActionsEnabled: bool
    OKActions: list[str]
    AlarmActions: list[str]
    InsufficientDataActions: list[str]
    MetricName: str
    Namespace: str
    Statistic: NotRequired[str]
    ExtendedStatistic: NotRequired[str]
    Dimensions: list[dict[str, str]]  # [{"Name": ..., "Value": ...}]
    Period: int
    Unit: NotRequired[str]
    EvaluationPeriods: int
    DatapointsToAlarm: NotRequired[int]
    Threshold: float
    ComparisonOperator: str
    TreatMissingData: str
    AlarmConfigurationUpdatedTimestamp: float
    StateValue: AlarmState
    StateReason: str
    StateReasonData: NotRequired[str]
    StateUpdatedTimestamp: float
    StateTransitionedTimestamp: float


class AlarmHistory(TypedDict):
    """An alarm's history, newest last (DescribeAlarmHistory's items, as CloudWatch shapes them)."""

    items: list[ApiJson]


COMPARISONS: dict[str, tuple[Callable[[float, float], bool], str]] = {
    "GreaterThanOrEqualToThreshold": (operator.ge, "greater than or equal to"),
    "GreaterThanThreshold": (operator.gt, "greater than"),
    "LessThanThreshold": (operator.lt, "less than"),
    "LessThanOrEqualToThreshold": (operator.le, "less than or equal to"),
}
STATES = ("OK", "ALARM", "INSUFFICIENT_DATA")
TREATMENTS = ("breaching", "notBreaching", "ignore", "missing")
WITHHELD = (
    "Datapoints withheld: the caller may not read this alarm's metric (cloudwatch:GetMetricStatistics), so its "
    "state reason, which shows them, is not shown."
)


def evaluate(
    alarm: AlarmDocument, window: list[Stat | None], end: float
) -> tuple[AlarmState, str, str]:
    """(state, reason, reason data) of `alarm` over `window`, its periods oldest first, the last
    ending at `end`."""
    statistic = alarm.get("Statistic") or alarm.get("ExtendedStatistic") or ""
    values = [stat.value(statistic) if stat is not None else None for stat in window]
    compare, words = COMPARISONS[alarm["ComparisonOperator"]]
    threshold, needed = (
        float(alarm["Threshold"]),
        int(alarm.get("DatapointsToAlarm") or alarm["EvaluationPeriods"]),
    )
    treatment = alarm.get("TreatMissingData") or "missing"
    period = int(alarm["Period"])
    stamped = [(end - period * (len(values) - index), value) for index, value in enumerate(values)]
    present = [(at, value) for at, value in stamped if value is not None]
    state: AlarmState
    if not present and treatment in ("missing", "ignore"):
        state = (
            "INSUFFICIENT_DATA"
            if treatment == "missing"
            else alarm.get("StateValue", "INSUFFICIENT_DATA")
        )
        reason = f"Insufficient Data: {len(values)} datapoints were unknown."
        return state, reason, _data(alarm, statistic, end, [], threshold)
    breaching = sum(1 for _, value in present if compare(value, threshold))
    if treatment == "breaching":
        breaching += len(values) - len(present)
    state = "ALARM" if breaching >= needed else "OK"
    recent = ", ".join(f"{value} ({_stamp(at)})" for at, value in reversed(present[-5:]))
    verb = "was" if breaching == 1 else "were"
    if state == "ALARM":
        reason = (
            f"Threshold Crossed: {breaching} out of the last {len(values)} datapoints [{recent}] {verb} {words} the "
            f"threshold ({threshold}) (minimum {needed} datapoint{'s' if needed > 1 else ''} for OK -> ALARM transition)."
        )
    else:
        reason = (
            f"Threshold Crossed: {breaching} out of the last {len(values)} datapoints {verb} {words} the threshold "
            f"({threshold}) [{recent}] (minimum {needed} datapoint{'s' if needed > 1 else ''} for ALARM -> OK "
            "transition)."
        )
    return (
        state,
        reason,
        _data(alarm, statistic, end, [value for _, value in reversed(present)], threshold),
    )


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%d/%m/%y %H:%M:%S")


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.000+0000")


def _data(
    alarm: AlarmDocument, statistic: str, end: float, recent: list[float], threshold: float
) -> str:
    """StateReasonData, as CloudWatch writes it for a metric alarm."""
    start = end - int(alarm["Period"]) * int(alarm["EvaluationPeriods"])
    return json.dumps(
        {
            "version": "1.0",
            "queryDate": _iso(end),
            "startDate": _iso(start),
            "statistic": statistic,
            "period": int(alarm["Period"]),
            "recentDatapoints": recent,
            "threshold": threshold,
            "evaluatedDatapoints": [],
        },
        separators=(",", ":"),
    )


def withheld(alarm: AlarmDocument) -> ApiJson:
    """`alarm` as DescribeAlarms shows it to a caller who may not read its metric: its state without
    the reason and reason data, which carry the metric's values (SetAlarmState's, the caller's own
    words, go too)."""
    shown = {key: value for key, value in alarm.items() if key != "StateReasonData"}
    if "StateReason" in shown:
        shown["StateReason"] = WITHHELD
    return shown
