"""The look-back averages the registry hands a hosted version's autoscaler (`autoscaling.windows`),
as Serve's controller averages a Serve replica's pushed stats."""

from __future__ import annotations

from serving.autoscaling.windows import MetricWindows, tracked


def test_each_metric_is_averaged_per_replica_over_the_window_only():
    windows = MetricWindows(look_back_s=10)
    windows.add("a", {"rpm": 60.0, "cpu": 10.0}, now=0)
    windows.add("a", {"rpm": 120.0, "cpu": 30.0}, now=2)
    windows.add("b", {"rpm": 30.0}, now=2)
    assert windows.averages(["a", "b"], now=3) == {
        "rpm": {"a": 90.0, "b": 30.0},
        "cpu": {"a": 20.0},
    }
    # the first sample of `a` falls out of the window; `b` has none left in it
    windows.add("a", {"rpm": 300.0, "cpu": 50.0}, now=11)
    assert windows.averages(["a", "b"], now=12.5) == {"rpm": {"a": 300.0}, "cpu": {"a": 50.0}}


def test_only_the_replicas_asked_for_count_and_forgotten_ones_are_gone():
    windows = MetricWindows(look_back_s=10)
    windows.add("a", {"rpm": 1.0}, now=0)
    windows.add("old", {"rpm": 1000.0}, now=0)
    assert windows.averages(["a"], now=1) == {"rpm": {"a": 1.0}}
    windows.keep(["a"])
    assert windows.averages(["a", "old"], now=1) == {"rpm": {"a": 1.0}}


def test_a_sample_reaches_the_registry_with_the_tracked_finite_numbers_only():
    # the model's autoscaling_metrics are tenant code's: names, values and their number its choice
    hostile = {
        "SageMakerVariantInvocationsPerInstance": 120,
        "queue_depth": float("nan"),
        "CPUUtilization": "99",
        "MemoryUtilization": True,
        **{f"junk{i}": 1.0 for i in range(10_000)},
    }
    tracked_names = [
        "SageMakerVariantInvocationsPerInstance",
        "queue_depth",
        "CPUUtilization",
        "MemoryUtilization",
    ]
    assert tracked(hostile, tracked_names) == {"SageMakerVariantInvocationsPerInstance": 120.0}
    assert tracked({"queue_depth": 3}, tracked_names) == {"queue_depth": 3.0}
