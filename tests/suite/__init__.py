"""The test suite's shared fixtures, by tier, loaded by tests/conftest.py (`pytest_plugins`).

Every tier: `models`, the models the tests serve, trained or written once per session. The Ray tiers
only (loaded when a run names a path outside tests/unit): `handlers`, the handler scripts served as
models; `services`, the S3 server, identities and instance types the endpoints reach; `otlp`, the OTLP
receiver the session's server traces to; `endpoints`,
the endpoints several test modules share, each built by one function; `endpoint_server`, one
embedded Ray and gateway per session, which deploys the endpoints a module names in its ENDPOINTS
(name -> builder) before its first test and deletes each after the last module that names it, and
hands the tests the SDK's Client to call them. An endpoint one module uses is built in that module,
next to its tests.
"""
