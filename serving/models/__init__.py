"""Where models come from and how they stay loaded: artifacts (`artifacts`: directories and safely
extracted archives), MultiModel stores (`store`: local and S3 prefixes, TargetModel rules, a bounded
disk cache), the LRU of loaded models (`cache`), the process-memory measures it sizes them with
(`memory`) and the MultiModel handler (`multimodel`).

Modules: `artifacts` (model data materialized), `sources` (a MultiModel prefix's store: folder or
S3), `s3_broker` (a sandboxed container's S3 calls, made by its supervisor), `targets` (what a
TargetModel may be), `store` (fetch and unpack), `cache` (the LRU of loaded models), `cache_events`
(what it reports), `cache_limits` (what a spec lets it hold), `memory` (what a model holds),
`multimodel` (the MultiModel handler).
"""
