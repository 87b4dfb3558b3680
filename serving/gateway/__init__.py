"""The endpoint server's request path: the router (authenticate, resolve the chain, authorize,
hops), the InvokeEndpointAsync queue over it (`async_invocations`), the transport to container data
ports, the relay of a response stream (`streaming`), and the control routes. Runs in the gateway
replica; imports no Ray (the Ray wing builds it).

Modules: `router` (the HTTP edge), `entry` (the one frame every way into an invocation runs in: its
clock, outcome and count), `invocation` (InvokeEndpoint's steps), `admission` (the route, the chain
the headers pick, their checks), `variants` (which production variant runs, which shadow gets a
copy), `shadows` (the copies, run after the caller's answer), `after_answer` (the one runner of what
runs after an answer: shadow copies, capture writes, async jobs), `transport` and `hop_client` (hops
to replica data ports), `replica_choice` (which replica), `hop_answers` (what comes back),
`failures` (what a caller is told of a container's failure), `state` (a registry snapshot in, the
request path's tables out), `public_descriptions` (descriptions less the machine's paths),
`async_invocations` (InvokeEndpointAsync), `openai_routes` (the OpenAI-compatible
`/v1/chat/completions` and `/v1/completions`, over the same pipeline) and `async_jobs` (its jobs and their journal), `streaming`
(a response stream relayed), `capture` (DataCaptureConfig's sampled records, written off the
caller's path), `body_budget` (bodies held before their sender is verified), `control_routes`
(`serving apply` / `delete` over HTTP).
"""
