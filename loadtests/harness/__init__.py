"""The benchmarks' shared harness: what every benchmark in loadtests/ would otherwise write again.

- `processes`: subprocesses in their own sessions, bounded waits, plain HTTP, interruption that
  still cleans up
- `servers`: our endpoint server for a benchmark (serving.ray_wing.EmbeddedServer), in this process
  or a child
- `peers`: what ours is compared with: the floor, the floor behind a proxy, and MLServer
- `versus`: a stack against a peer's runtime for the same model: answers checked, wrk cases
  interleaved over rounds, CPU per request, medians and ratios
- `floor_server`, `proxy_floor`, `hop_client`: processes the benchmarks start (`python -m
  loadtests.harness.NAME`): the floor, the cheapest proxy in front of it, one router hop timed alone
- `models`: models trained from scikit-learn's bundled data (iris pipeline, the demo's, the fifteen
  hetero ones)
- `wrk`: closed-loop wrk cases with latency, errors and CPU per request; `loadtest`: `serving
  loadtest` runs
- `cpu`: CPU accounting per process group from /proc; `proctree`: a driver's process tree, its
  memory and CPU
- `profile`: py-spy profiles by component; `stats`: percentiles, latency summaries, Zipf weights
- `results`: results JSON, a benchmark's section of a docs page, machine facts and versions
"""
