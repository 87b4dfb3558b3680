"""OpenTelemetry traces of invocations: off unless the process's standard `OTEL_*` variables turn
them on, and then one trace per invocation, joined to the caller's W3C `traceparent`.

Modules: `spans` (what the request path calls: an invocation's root span, its steps, its hops and
their attempts; a no-op when tracing is off, which then never imports OpenTelemetry), `otel_sdk`
(the OpenTelemetry SDK, imported only once tracing is on: the tracer provider, sampler, resource and
exporter that the `OTEL_*` variables describe, the W3C TraceContext propagator, the trace id on log
lines) and `hop_steps` (a container's steps of one traced hop, carried back on its answer). Imports
only the leaves (`protocol`). docs/tracing.md says what an operator sets and sees.
"""
