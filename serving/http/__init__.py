"""HTTP serving plumbing shared by the gateway and the model server: uvicorn on its own thread (`server`)
and what one client may cost before the app sees its request (`limits`).
"""
