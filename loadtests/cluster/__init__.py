"""A simulated cluster on one machine: hosts as Linux network namespaces on a bridge, each with a CPU
quota, each running a Ray node and its gateways (issue 61).

- `machine`: the kernel's part: namespaces, the bridge and its veths, cgroups (v1 `cpu` or v2
  `cpu.max`), processes started inside a host, a host killed whole, and a tear-down that leaves none of
  them behind.
- `cluster`: Ray and `serving up` on those hosts: a head, workers that join and leave, the gateways'
  addresses a load generator spreads its connections over.
- `echo`: the model the tests and benchmarks serve (it answers with its process ID: which host answered).
- `balanced_load`, `traffic`: callers behind a balancer, wrk per host, CPU from /proc.
- `registry_readers`, `registry_fanout`: simulated gateways long-polling the real registry.

Root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) is needed; `machine.preflight()` names what is missing.
"""
