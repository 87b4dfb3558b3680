"""The control-plane API: SageMaker's model / endpoint-config / endpoint operations and Application Auto
Scaling's, on the JSON protocol boto3 speaks (`POST /`, `X-Amz-Target`), stored in SQLite and carried out by
deploying endpoint specs. Imports the spec (`config`), access control, the gateway's variant table and the
error types; never Ray (the Ray wing passes in a `Deployer`) nor the model server.
"""
