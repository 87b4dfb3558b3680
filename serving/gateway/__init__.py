"""The endpoint server's request path: the router (authenticate, resolve the chain, authorize, hops), the
InvokeEndpointAsync queue over it (`async_invocations`), the transport to container data ports, the relay of a
response stream (`streaming`), and the control routes. Runs in the gateway replica; imports no Ray
(the Ray wing builds it).
"""
