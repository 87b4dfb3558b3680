"""CloudWatch's metrics and alarms over this runtime's own counters: SageMaker's metric names and
dimensions in `AWS/SageMaker` (and utilization in `/aws/sagemaker/Endpoints`), sampled every 10 s in
the control plane, answered and alarmed on through CloudWatch's API. Imports errors, protocol and
the merged metric families; never Ray (the Ray wing feeds the sampler) nor the gateway.

Modules: `catalogue` (which SageMaker metric comes from which family), `statistics` (a datapoint's
statistic set and its percentiles), `sampler` (merged families to one interval's datapoints),
`datapoints` (kept for the retention window), `alarms` (one alarm's evaluation), `inputs` (requests,
validated), `api` (the operations), `api_errors` (the errors it answers).
"""
