"""serving.tracing.hop_steps: what a container says of its steps is read deny-by-default (the
header is tenant code's to write)."""

from __future__ import annotations

from serving.tracing import hop_steps


def test_steps_round_trip_within_the_window() -> None:
    steps = [("queue", 100, 150), ("decode", 150, 160), ("predict", 160, 400), ("encode", 400, 410)]
    header = hop_steps.render(steps, 3)
    assert header == "queue=100-150,decode=150-160,predict=160-400,encode=400-410,batch=3"
    assert hop_steps.parse(header, 0, 1_000) == (steps, 3)


def test_a_forged_header_cannot_place_spans_outside_its_attempt() -> None:
    header = "predict=1-99999999999999999999,decode=500-400,encode=2000-3000"
    steps, batch = hop_steps.parse(header, 100, 1_000)
    assert steps == [("predict", 100, 1_000), ("decode", 500, 500), ("encode", 1_000, 1_000)]
    assert batch is None


def test_unknown_repeated_and_malformed_entries_are_dropped() -> None:
    header = ",".join(
        [
            "predict=100-200",
            "predict=300-400",  # a repeat
            "exfiltrate=100-200",  # not a step
            "decode=abc-def",
            "encode=100",  # no end
            "batch=7-8",  # a range for the batch
            "queue=100-200;x=1",
        ]
    )
    assert hop_steps.parse(header, 0, 1_000) == ([("predict", 100, 200)], None)


def test_an_oversized_header_is_ignored_whole() -> None:
    header = ",".join(["predict=1-2"] * 100)
    assert len(header) > hop_steps.MAX_HEADER
    assert hop_steps.parse(header, 0, 10) == ([], None)
