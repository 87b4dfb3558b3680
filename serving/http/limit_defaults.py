"""The defaults of the HTTP servers' per-client limits, in one place for both readers.

`ServerSettings` documents and validates them (the gateway's server); `HttpLimits` uses them as they
are in every container process, which serves a data port but has no settings: importing
`serving.settings` there would load pydantic-settings for nothing, at every container process's
start (docs/benchmarks/bench_idle.md).
"""

MAX_CONNECTIONS = 1024
MAX_HEADER_BYTES = 16384
MAX_HEADER_COUNT = 100
HEADER_TIMEOUT_S = 10.0
BODY_IDLE_TIMEOUT_S = 20.0
BODY_TIMEOUT_S = 60.0
