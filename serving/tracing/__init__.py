"""OpenTelemetry traces of invocations: off unless the process's standard `OTEL_*` variables turn
them on, and then one trace per invocation, joined to the caller's W3C `traceparent`.

Modules: `spans` (what the request path calls: an invocation's root span, its steps, its hops and
their attempts; a no-op when tracing is off, which then never imports OpenTelemetry) and `otel_sdk`
(the OpenTelemetry SDK, imported only once tracing is on: the tracer provider, sampler, resource and
exporter that the `OTEL_*` variables describe, and the W3C TraceContext propagator). Imports only
the leaves (`protocol`). Not yet switched on by `serving up` / `serving server`: the branch's
TRACING_NOTES.md says what is left before docs/tracing.md can say what an operator sets and sees.
"""
