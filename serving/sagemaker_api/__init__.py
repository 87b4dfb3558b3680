"""The control-plane API: SageMaker's model / endpoint-config / endpoint operations, Application
Auto Scaling's, and CloudWatch's (the `cloudwatch` package), on the JSON protocols boto3 speaks
(`POST /`, `X-Amz-Target`), stored in SQLite and carried out by deploying endpoint specs. Imports
the spec (`config`), access control, the gateway's variant table and the error types; never Ray (the
Ray wing passes in a `Deployer`) nor the model server.

Modules: `routes` (`POST /` on every gateway: authentication, IAM actions, audit; the operations it
admits), `service` (assembled from settings where the control plane runs, each operation by name), `shapes` and `autoscaling_shapes` (requests, validated),
`sagemaker` (SageMaker's operations assembled), one module per resource over one `api_context`:
`models`, `endpoint_configs`, `endpoints`, and `variant_fleet` (each variant as a served endpoint,
and the routes over them); `endpoint_update` (an update from its new generation through its steps to
finish, rollback and drain), `deployment` (a DeploymentConfig made into steps), `stored` (the stored
documents, typed), `descriptions` (DescribeEndpoint's variants), `application_autoscaling`
(Application Auto Scaling's), `translate` (resources as specs), `images` (Image and InstanceType),
`resources` (ARNs, paging, the `Deployer`), `database` (the SQLite state, a typed table per kind),
`state_file` (its file, opened through no symbolic link), `sealed` (secret Environment values),
`model_roots` (which folders may be roots), `authorization` (what a call must be allowed: the IAM
action on each resource it names).
"""
