"""The Open Inference Protocol (V2: KServe's and Triton's inference API) beside InvokeEndpoint, on
every gateway.

It owns the V2 wire formats and adapts them onto the gateway's invocation pipeline; it imports the
gateway, never the Ray wing (which mounts its routes and starts its gRPC listener). Modules:
`dataplane` (one V2 call admitted, run and answered, whichever transport carried it), `rest` (the
`/v2/...` routes), `grpc_service` (`GRPCInferenceService` on `--grpc-port`), `codec` (a REST
inference request into a container's body, its answer into outputs and a response), `grpc_codec`
(the gRPC messages in and out), `grpc_messages_pb2` (protoc's code for `grpc_messages.proto`),
`datatypes` (V2 tensors as NumPy arrays, JSON and binary), `signatures` (each container's model
tensors, read from its replicas).
"""
