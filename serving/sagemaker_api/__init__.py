"""The control-plane API: SageMaker's model / endpoint-config / endpoint operations, Application Auto
Scaling's, and CloudWatch's (the `cloudwatch` package), on the JSON protocols boto3 speaks (`POST /`,
`X-Amz-Target`), stored in SQLite and carried out by deploying endpoint specs. Imports the spec (`config`), access
control, the gateway's variant table and the error types; never Ray (the Ray wing passes in a `Deployer`) nor the
model server.

Modules: `routes` (`POST /`: authentication, IAM actions, audit), `service` (assembled from settings), `shapes`
(requests, validated), `sagemaker` and `endpoints` (SageMaker's operations), `deployment` (an update's
DeploymentConfig: traffic steps and rollback), `descriptions` (DescribeEndpoint's variants),
`application_autoscaling` (Application Auto Scaling's), `translate` (resources as specs), `images` (Image and
InstanceType), `resources` (ARNs, paging, the `Deployer`), `database` (the SQLite state), `state_file` (its file,
opened through no symbolic link), `sealed` (secret
Environment values), `model_roots` (which folders may be roots), `authorization` (what a call must be allowed:
the IAM action on each resource it names).
"""
