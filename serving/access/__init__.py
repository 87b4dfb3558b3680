"""Who may call what: the identities file, SigV4 and bearer authentication, IAM-style policies, and
the gateway's access decision per endpoint (audited). No web framework and no Ray here.

Modules: `identities` (the identities file), `policy_documents` (an IAM-style document validated),
`policies` (load and evaluate), `sigv4` (who is calling: Signature V4 and bearer keys), `_signer`
(botocore's signer, as the verifier uses it), `decision` (one endpoint's access control:
authenticate, authorize, audit).
"""
