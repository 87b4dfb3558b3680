"""The model server: the process where a container's model loads and tenant code runs (`main`), its
data port app (`app`, with `streaming` for a streamed answer), its sandbox (`sandbox`), the
supervisor side that starts and watches it (`supervisor`) and its metric events (`events`). No Ray:
the process must hold no cluster credentials.

Modules: `launcher` (confine, then `exec` the model server), `fork_template` (a stack's framework
imported once per machine, container processes forked from it), `forked` (the supervisor's side of
a forked one), `main` (the model server's entry),
`app` (the data port), `predictors` (how a request's prediction runs, chosen once), `batching` and
`inline` (two of those ways), `streaming` (a streamed answer), `tfs_rest` (the tensorflow stack's
`context.rest_uri`), `sandbox` (its network namespace, Landlock, seccomp, no privileges), `netns`
(the network namespace), `seccomp` (the socket allowlist), `supervisor` (the replica's side: start,
watch, stop), `restart_budget` (how often a dead process is started again in place),
`container_config` (what a process is given: its config, paths and environment),
`scratch` (scratch folders, reclaimed when their supervisor dies), `events` (metric events for the
supervisor).
"""
