"""The Open Inference Protocol (V2: KServe's and Triton's inference API) beside InvokeEndpoint, on every gateway.

It owns the V2 wire format and adapts it onto the gateway's invocation pipeline; it imports the gateway, never the
Ray wing (which mounts its routes). Modules: `rest` (the `/v2/...` routes), `codec` (an inference request into a
container's body, its answer into an inference response), `datatypes` (V2 tensors as NumPy arrays, JSON and
binary), `signatures` (each container's model tensors, read from its replicas).
"""
