"""The benchmarks' shared harness: what every script in loadtests/ would otherwise write again.

- `processes`: subprocesses in their own sessions, bounded waits, plain HTTP, interruption that still cleans up
- `servers`: our endpoint server for a benchmark (serving.ray_wing.EmbeddedServer), in this process or a child
- `peers`: what ours is compared with: the floor (floor_server.py) and MLServer
- `models`: models trained from scikit-learn's bundled data (iris pipeline, the demo's, the fifteen hetero ones)
- `wrk`: closed-loop wrk cases with latency, errors and CPU per request; `loadtest`: `serving loadtest` runs
- `cpu`: CPU accounting per process group from /proc; `proctree`: a driver's process tree, its memory and CPU
- `profile`: py-spy profiles by component; `stats`: percentiles, latency summaries, Zipf weights
- `results`: results JSON, a benchmark's section of a docs page, machine facts and versions
"""
