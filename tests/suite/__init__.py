"""The test suite's shared fixtures, loaded for every tier by tests/conftest.py (`pytest_plugins`).

`models`: the models the tests serve, trained or written once per session (and the S3 server some read from);
`endpoints`: the endpoints several test modules share, each built by one function; `endpoint_server`: one embedded
Ray and gateway per session, which deploys the endpoints a module names in its ENDPOINTS (name -> builder) before
its first test and deletes each after the last module that names it. An endpoint one module uses is built in that
module, next to its tests.
"""
