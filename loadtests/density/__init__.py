"""bench_density's parts: the floor process, MLServer's runtimes and repository, /proc/PID/smaps by
package, and the report."""
