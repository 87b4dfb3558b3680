"""The model server: the process where a container's model loads and tenant code runs (`main`), its data
port app (`app`, with `streaming` for a streamed answer), its sandbox (`sandbox`), the supervisor side that starts and watches it (`supervisor`)
and its metric events (`events`). No Ray: the process must hold no cluster credentials.
"""
