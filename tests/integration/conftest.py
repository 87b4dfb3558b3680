"""Integration tests run against the session's shared endpoint server (tests/server_fixtures.py)."""
