"""Integration tests run against the session's endpoint server, with the endpoints each module names
in ENDPOINTS (tests/suite/endpoint_server.py)."""
