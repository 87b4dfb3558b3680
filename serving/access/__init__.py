"""Who may call what: the identities file, SigV4 and bearer authentication, IAM-style policies, and the
gateway's access decision per endpoint (audited). No web framework and no Ray here.
"""
