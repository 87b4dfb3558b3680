"""Where models come from and how they stay loaded: artifacts (`artifacts`: directories and safely
extracted archives), MultiModel stores (`store`: local and S3 prefixes, TargetModel rules, a bounded disk
cache), the LRU of loaded models (`cache`), the process-memory measures it sizes them with (`memory`) and
the MultiModel handler (`multimodel`).
"""
