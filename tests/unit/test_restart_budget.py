"""A container process is started again in place a bounded number of times per window."""

from __future__ import annotations

from serving.model_server.restart_budget import RestartBudget


def test_the_budget_allows_its_restarts_then_refuses_until_the_window_passes() -> None:
    now = [0.0]
    budget = RestartBudget(restarts=3, window_s=60.0, clock=lambda: now[0])
    assert [budget.take() for _ in range(3)] == [True, True, True]
    assert not budget.take()
    now[0] = 59.9
    assert not budget.take()  # the first restart is still inside the window
    now[0] = 60.1
    assert budget.take()  # the first three fell out of it
    assert budget.take() and budget.take()
    assert not budget.take()
