"""bench_batching.py's HTTP part: the MLP models it builds, our endpoints and MLServer serving them,
and the wrk cases at 64 connections with and without batching (`http`); `mlserver_runtime` runs
inside MLServer."""
