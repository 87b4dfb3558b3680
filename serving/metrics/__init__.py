"""Prometheus metrics: what the router counts per invocation (`invocations`) and `GET /metrics`,
which merges it with every Ray node's replica metrics (`exposition`). Replica-side recording lives
in the Ray wing.
"""
