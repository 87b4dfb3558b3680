"""HTTP serving plumbing shared by the gateway and the model server: uvicorn on its own thread
(`server`), what one client may cost before the app sees its request (`limits`, their defaults in
`limit_defaults`), and where an error becomes a response (`responses`: the one exception handler and
the app factory every server app is built with), AWS event-stream messages (`eventstream`, for
response streams), and the Unix socket beside a container's data port for hops from a gateway on the
same machine (`local_socket`).

Modules: `server` (uvicorn in a thread), `limits` and `limit_defaults` (what a connection may cost),
`bodies` (the one bounded reader of a request body), `hot_path` (the invocation route ahead of the
middleware), `one_write` (a response in one socket write), `responses` (the one error shape),
`eventstream` (AWS's event-stream framing), `local_socket` (a data port's Unix socket), and the
gateway's gRPC port: `grpc_server` (the server of unary calls), `grpc_calls` (what a handler sees),
`grpc_connection` (one HTTP/2 connection), `grpc_streams` (a call's stream and flow control out),
`grpc_heads` (request headers read, answers' header blocks), `h2` (HTTP/2's frames and HPACK).
"""
