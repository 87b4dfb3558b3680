"""HTTP serving plumbing shared by the gateway and the model server: uvicorn on its own thread (`server`),
what one client may cost before the app sees its request (`limits`, their defaults in `limit_defaults`), and
where an error becomes a response (`responses`: the one exception handler and the app factory every server app
is built with), AWS event-stream messages (`eventstream`, for response streams), and the Unix socket beside a
container's data port for hops from a gateway on the same machine (`local_socket`).
"""
