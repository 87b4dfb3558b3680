"""Config documents users write: the endpoint spec, the identities file and the policy documents share one
capability (`documents`): a strict pydantic base (unknown fields refused), one error shape naming the
field path, one rule for paths written in a document. The spec's fields and loading are in `spec`.
No Ray, no web framework.
"""
