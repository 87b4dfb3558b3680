"""Capabilities derived from the cluster's root secret (`keys`) and the signed gateway -> container
hops that use them (`hops`). Pure: standard library only.
"""
