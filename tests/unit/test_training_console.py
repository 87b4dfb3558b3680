"""`serving train`'s console: the run's own lines, once each, and no PlacementGroupCleaner without a
State API.

Issue 42, item 8: `make demo`'s console was ~300 lines, most of them Ray's, every epoch line twice;
and Ray Train's PlacementGroupCleaner, which asks the State API (served by the dashboard, which the
embedded Ray does not run) whether the train controller lives, once removed the placement group
under the running workers.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from serving.ray_wing import training
from serving.training.session import LocalSession, say


def test_progress_lines_are_printed_once_each_as_they_come(tmp_path: Path, capsys) -> None:
    progress = tmp_path / "run.progress"

    def worker() -> None:
        for epoch in range(1, 4):
            say(f"[serving train] m: epoch {epoch}", str(progress))
            time.sleep(0.3)
        with open(progress, "a") as out:
            # still being written when the block ends: not shown torn
            out.write("[serving train] m: half a line")

    with training._printed(str(progress)):
        thread = threading.Thread(target=worker)
        thread.start()
        time.sleep(0.8)
        # printed while the run goes on, not only at its end
        shown_meanwhile = capsys.readouterr().out
        thread.join()
    shown = shown_meanwhile + capsys.readouterr().out
    assert "epoch 1" in shown_meanwhile
    assert shown.splitlines() == [f"[serving train] m: epoch {epoch}" for epoch in (1, 2, 3)]


def test_a_local_session_says_to_the_progress_file_or_to_stdout(tmp_path: Path, capsys) -> None:
    LocalSession({}, progress_file=str(tmp_path / "p")).say("to the file")
    LocalSession({}).say("to stdout")
    assert (tmp_path / "p").read_text() == "to the file\n"
    assert capsys.readouterr().out == "to stdout\n"


@pytest.mark.frameworks
def test_without_a_state_api_the_trainer_has_no_placement_group_cleaner(monkeypatch) -> None:
    import ray.train
    from ray.train.torch import TorchTrainer

    def callbacks(state_api: bool) -> list[str]:
        monkeypatch.setattr(training, "_state_api", state_api)
        trainer = training._trainer(TorchTrainer)(
            lambda: None, scaling_config=ray.train.ScalingConfig(num_workers=1)
        )
        return [type(callback).__name__ for callback in trainer._create_default_callbacks()]

    # a cluster: its dashboard serves the API
    assert "PlacementGroupCleanerCallback" in callbacks(state_api=True)
    assert "PlacementGroupCleanerCallback" not in callbacks(state_api=False)  # the embedded Ray
