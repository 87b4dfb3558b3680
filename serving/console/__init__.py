"""The operator console: `GET /console` on every gateway, a read-only page of every endpoint, its
variants, containers, updates, scaling, alarms and charts (docs/console.md). Imports the
control-plane API's services, CloudWatch's metric store, access and protocol; never Ray (the Ray
wing runs the assembly in the control plane and serves the routes on the gateway).

Modules: `access` (who may read it: anonymous on loopback, else an API identity's key and policies),
`series` (a variant's or container's charts from the metric store), `overview` (the JSON documents
the page reads, assembled in one call), `page` (the page, its assets, its JSON routes, with their
security headers). `assets/`: the page, its script and style, and uPlot (vendored, see its README).
"""
