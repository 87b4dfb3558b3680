"""bench_invoke.py's own parts: `measure` (bodies, our endpoints, in-process and side measurements),
`analysis` (ratios, hop costs, targets), `docs` (its section of docs/benchmarks/bench_invoke.md)."""
