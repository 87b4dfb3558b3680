"""Config documents users write: the endpoint spec (pydantic, unknown fields refused, every error naming
the field path). No Ray, no web framework.
"""
