"""CloudWatch's operations over the runtime's metrics: statistics and listing from `datapoints`,
metric alarms kept in the control-plane API's database, evaluated every RESOLUTION_S as the sampler
records an interval.

Alarm actions (SNS topics, Auto Scaling policies) are stored and shown, never run: nothing here can
reach them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar, cast

from prometheus_client.metrics_core import Metric

from serving.cloudwatch import inputs
from serving.cloudwatch.alarms import AlarmDocument, AlarmHistory, AlarmState, evaluate
from serving.cloudwatch.api_errors import (
    AlarmLimitExceededError,
    AlarmNotFoundError,
    InvalidFormatError,
    InvalidNextTokenError,
    InvalidParameterCombinationError,
    InvalidParameterValueError,
)
from serving.cloudwatch.datapoints import (
    PERIODS_HELP,
    RESOLUTION_S,
    RETENTION_S,
    MetricStore,
    valid_period,
)
from serving.cloudwatch.sampler import Dimensions, Key, Sampler, Served
from serving.documents import ApiJson

__all__ = ["CloudWatchApi"]

MAX_ALARMS = 1000
HISTORY_KEPT = 100  # history items kept per alarm
D = TypeVar("D")


class Store(Protocol[D]):
    """Where one kind of document is kept by name (a table of the control-plane API's database)."""

    def get(self, name: str) -> D | None: ...
    def all(self) -> list[D]: ...
    def put(self, name: str, document: D) -> None: ...
    def delete(self, name: str) -> bool: ...


class CloudWatchApi:
    """The operations of boto3's `cloudwatch` client, for the namespaces in `catalogue`."""

    def __init__(
        self,
        alarms: Store[AlarmDocument],
        history: Store[AlarmHistory],
        region: str,
        account: str,
        layout: Callable[[str], Served | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`layout(served endpoint)`: its public names and replicas, None for what is not an
        endpoint."""
        self.alarms, self.history = alarms, history
        self.region, self.account, self.layout, self.clock = region, account, layout, clock
        self.store, self.sampler = MetricStore(), Sampler()
        self.lock = threading.Lock()  # alarm changes and evaluations, one at a time

    # --- the sampler's tick -----------------------------------------------------------------------
    def observe(self, families: Iterable[Metric], now: float) -> bool:
        """Record the interval that ended at the last RESOLUTION_S boundary before `now`, then
        evaluate alarms; True if any endpoint was invoked in it."""
        end = now - now % RESOLUTION_S
        points = self.sampler.interval(families, self.layout)
        self.store.record(end - RESOLUTION_S, points, end)
        self.evaluate(end)
        return any(metric == "Invocations" for _, metric, _ in points)

    def evaluate(self, end: float) -> None:
        with self.lock:
            for alarm in self.alarms.all():
                window = self.store.window(
                    _key(alarm), end, int(alarm["Period"]), int(alarm["EvaluationPeriods"])
                )
                state, reason, data = evaluate(alarm, window, end)
                if state != alarm["StateValue"]:
                    self._transition(alarm, state, reason, data)

    def _transition(
        self, alarm: AlarmDocument, state: AlarmState, reason: str, data: str | None
    ) -> None:
        now, old = self.clock(), alarm["StateValue"]
        alarm["StateValue"], alarm["StateReason"] = state, reason
        alarm["StateUpdatedTimestamp"] = alarm["StateTransitionedTimestamp"] = now
        if data is not None:
            alarm["StateReasonData"] = data
        self.alarms.put(alarm["AlarmName"], alarm)
        self._history(
            alarm["AlarmName"], "StateUpdate", f"Alarm updated from {old} to {state}", now
        )

    def _history(self, name: str, kind: str, summary: str, now: float) -> None:
        items = (self.history.get(name) or {"items": []})["items"]
        item = {"AlarmName": name, "AlarmType": "MetricAlarm", "Timestamp": now}
        items.append({**item, "HistoryItemType": kind, "HistorySummary": summary})
        self.history.put(name, {"items": items[-HISTORY_KEPT:]})

    # --- alarms -----------------------------------------------------------------------------------
    def PutMetricAlarm(self, body: ApiJson) -> ApiJson:
        request = inputs.parse(inputs.PutMetricAlarmInput, body, "PutMetricAlarm")
        found = inputs.catalogued(request.Namespace, request.MetricName)
        if (
            not valid_period(request.Period)
            or request.Period * request.EvaluationPeriods > RETENTION_S
        ):
            raise InvalidParameterValueError(
                f"Period {request.Period} x EvaluationPeriods {request.EvaluationPeriods}: the period must be "
                f"{PERIODS_HELP}, and the periods evaluated at most {RETENTION_S} seconds in all"
            )
        if request.ExtendedStatistic is not None and found.kind != "latency":
            raise InvalidParameterCombinationError(
                f"ExtendedStatistic: {request.MetricName} has no distribution here; percentiles are kept for the "
                "latency metrics only"
            )
        now = self.clock()
        with self.lock:
            existing = self.alarms.get(request.AlarmName)
            if existing is None and len(self.alarms.all()) >= MAX_ALARMS:
                raise AlarmLimitExceededError(f"this server keeps at most {MAX_ALARMS} alarms")
            # the request, validated
            fields: ApiJson = request.model_dump(exclude_none=True, exclude={"Tags"})
            alarm: AlarmDocument = {
                **fields,  # type: ignore[typeddict-item]
                "Dimensions": [dimension.model_dump() for dimension in request.Dimensions],
                "AlarmArn": f"arn:aws:cloudwatch:{self.region}:{self.account}:alarm:{request.AlarmName}",
                "AlarmConfigurationUpdatedTimestamp": now,
                "StateValue": "INSUFFICIENT_DATA",
                "StateReason": "Unchecked: Initial alarm creation",
                "StateUpdatedTimestamp": now,
                "StateTransitionedTimestamp": now,
            }
            # an update keeps the state until the next evaluation, as CloudWatch does
            if existing is not None:
                kept = {key: value for key, value in existing.items() if key.startswith("State")}
                alarm.update(cast(AlarmDocument, kept))
            self.alarms.put(request.AlarmName, alarm)
            verb = "updated" if existing is not None else "created"
            self._history(
                request.AlarmName, "ConfigurationUpdate", f'Alarm "{request.AlarmName}" {verb}', now
            )
        return {}

    def DescribeAlarms(self, body: ApiJson) -> ApiJson:
        request = inputs.parse(inputs.DescribeAlarmsInput, body, "DescribeAlarms")
        alarms = [
            alarm
            for alarm in self.alarms.all()
            if (not request.AlarmNames or alarm["AlarmName"] in request.AlarmNames)
            and alarm["AlarmName"].startswith(request.AlarmNamePrefix or "")
            and (request.StateValue is None or alarm["StateValue"] == request.StateValue)
            and (
                request.ActionPrefix is None
                or any(a.startswith(request.ActionPrefix) for a in alarm["AlarmActions"])
            )
        ]
        if request.AlarmTypes and "MetricAlarm" not in request.AlarmTypes:
            alarms = []
        shown, token = _page(alarms, request.NextToken, request.MaxRecords)
        return {
            "MetricAlarms": shown,
            "CompositeAlarms": [],
            **({"NextToken": token} if token else {}),
        }

    def DeleteAlarms(self, body: ApiJson) -> ApiJson:
        request = inputs.parse(inputs.DeleteAlarmsInput, body, "DeleteAlarms")
        with self.lock:
            # names that are no alarm are skipped, as CloudWatch does
            for name in request.AlarmNames:
                self.alarms.delete(name)
        return {}

    def SetAlarmState(self, body: ApiJson) -> ApiJson:
        request = inputs.parse(inputs.SetAlarmStateInput, body, "SetAlarmState")
        if request.StateReasonData is not None:
            try:
                json.loads(request.StateReasonData)
            except ValueError:
                raise InvalidFormatError(
                    "StateReasonData must be JSON, as CloudWatch requires"
                ) from None
        with self.lock:
            alarm = self.alarms.get(request.AlarmName)
            if alarm is None:
                raise AlarmNotFoundError(f"Alarm {request.AlarmName} not found")
            self._transition(
                alarm, request.StateValue, request.StateReason, request.StateReasonData
            )
        return {}

    def DescribeAlarmHistory(self, body: ApiJson) -> ApiJson:
        request = inputs.parse(inputs.DescribeAlarmHistoryInput, body, "DescribeAlarmHistory")
        names = (
            [request.AlarmName]
            if request.AlarmName
            else [alarm["AlarmName"] for alarm in self.alarms.all()]
        )
        items = [
            item
            for name in names
            for item in (self.history.get(name) or {"items": []})["items"]
            if (
                request.HistoryItemType is None
                or item["HistoryItemType"] == request.HistoryItemType
            )
            and (request.StartDate is None or item["Timestamp"] >= request.StartDate)
            and (request.EndDate is None or item["Timestamp"] <= request.EndDate)
        ]
        items.sort(
            key=lambda item: item["Timestamp"], reverse=request.ScanBy == "TimestampDescending"
        )
        shown, token = _page(items, request.NextToken, request.MaxRecords)
        return {"AlarmHistoryItems": shown, **({"NextToken": token} if token else {})}

    # --- metrics ----------------------------------------------------------------------------------
    def GetMetricStatistics(self, body: ApiJson) -> ApiJson:
        request = inputs.parse(inputs.GetMetricStatisticsInput, body, "GetMetricStatistics")
        found = inputs.catalogued(request.Namespace, request.MetricName, known_only=False)
        inputs.check_range(request.StartTime, request.EndTime, request.Period)
        datapoints = []
        if found is not None and request.Unit in (None, found.unit):
            key = (request.Namespace, request.MetricName, _dimensions(request.Dimensions))
            for at, stat in self.store.periods(
                key, request.StartTime, request.EndTime, request.Period
            ):
                point: ApiJson = {"Timestamp": at, "Unit": found.unit}
                for statistic in request.Statistics or []:
                    point[statistic] = stat.value(statistic)
                percentiles = {
                    p: value
                    for p in request.ExtendedStatistics or []
                    if (value := stat.value(p)) is not None
                }
                if percentiles:
                    point["ExtendedStatistics"] = percentiles
                datapoints.append(point)
        return {"Label": request.MetricName, "Datapoints": datapoints}

    def GetMetricData(self, body: ApiJson) -> ApiJson:
        request = inputs.parse(inputs.GetMetricDataInput, body, "GetMetricData")
        results = []
        for query in request.MetricDataQueries:
            stat, metric = query.MetricStat, query.MetricStat.Metric
            found = inputs.catalogued(metric.Namespace, metric.MetricName, known_only=False)
            inputs.check_range(
                request.StartTime, request.EndTime, stat.Period, limit=request.MaxDatapoints
            )
            if stat.Stat not in inputs.STATISTICS and not inputs.PERCENTILE.match(stat.Stat):
                raise InvalidParameterValueError(
                    f"MetricDataQueries[{query.Id}].MetricStat.Stat {stat.Stat!r}: one of "
                    f"{', '.join(inputs.STATISTICS)} or a percentile pNN.NN"
                )
            points: list[tuple[float, float]] = []
            if found is not None and stat.Unit in (None, found.unit):
                key = (metric.Namespace, metric.MetricName, _dimensions(metric.Dimensions))
                for at, values in self.store.periods(
                    key, request.StartTime, request.EndTime, stat.Period
                ):
                    if (value := values.value(stat.Stat)) is not None:
                        points.append((at, value))
            points.sort(reverse=request.ScanBy == "TimestampDescending")
            if query.ReturnData:
                results.append(
                    {
                        "Id": query.Id,
                        "Label": query.Label or metric.MetricName,
                        "Timestamps": [at for at, _ in points],
                        "Values": [value for _, value in points],
                        "StatusCode": "Complete",
                    }
                )
        return {"MetricDataResults": results, "Messages": []}

    def ListMetrics(self, body: ApiJson) -> ApiJson:
        request = inputs.parse(inputs.ListMetricsInput, body, "ListMetrics")
        if request.Namespace is not None:
            inputs.check_namespace(request.Namespace)
        since = self.store.latest - (3 * 3600 if request.RecentlyActive else RETENTION_S)
        metrics = [
            {
                "Namespace": namespace,
                "MetricName": name,
                "Dimensions": [{"Name": n, "Value": v} for n, v in dimensions],
            }
            for namespace, name, dimensions in sorted(self.store.keys(since))
            if request.Namespace in (None, namespace)
            and request.MetricName in (None, name)
            and all(
                any(n == wanted.Name and wanted.Value in (None, v) for n, v in dimensions)
                for wanted in request.Dimensions
            )
        ]
        shown, token = _page(metrics, request.NextToken, 500)
        return {"Metrics": shown, **({"NextToken": token} if token else {})}


def _dimensions(dimensions: Iterable[inputs.Dimension]) -> Dimensions:
    return tuple(sorted((dimension.Name, dimension.Value) for dimension in dimensions))


def _key(alarm: AlarmDocument) -> Key:
    dimensions = tuple(sorted((d["Name"], d["Value"]) for d in alarm.get("Dimensions", [])))
    return (alarm["Namespace"], alarm["MetricName"], dimensions)


def _page(items: list[Any], token: str | None, size: int) -> tuple[list[Any], str | None]:
    """One page of `items` from the offset `token` names, and the next page's token."""
    if token is not None and not token.isdigit():
        raise InvalidNextTokenError(
            "The service couldn't process NextToken: it is not one this server gave"
        )
    start = int(token or 0)
    return items[start : start + size], str(start + size) if start + size < len(items) else None
