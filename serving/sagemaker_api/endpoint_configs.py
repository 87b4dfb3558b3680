"""SageMaker's endpoint-config operations: a config names each production and shadow variant's
model, instance type and count, and the data capture every variant shares; it only stores (checked:
each model exists, each instance type is in this server's table). CreateEndpoint and UpdateEndpoint
read it.
"""

from __future__ import annotations

from serving.errors import ApiValidationError
from serving.sagemaker_api import shapes
from serving.sagemaker_api.api_context import ApiContext, missing
from serving.sagemaker_api.models import Models
from serving.sagemaker_api.resources import page, sort_and_filter
from serving.sagemaker_api.stored import ApiJson, EndpointConfigDocument

__all__ = ["EndpointConfigs"]


class EndpointConfigs:
    """CreateEndpointConfig, DescribeEndpointConfig, ListEndpointConfigs, DeleteEndpointConfig."""

    def __init__(self, context: ApiContext, models: Models) -> None:
        self.context, self.models = context, models

    def CreateEndpointConfig(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.CreateEndpointConfigInput, body, "CreateEndpointConfig")
        name = request.EndpointConfigName
        if self.context.state.endpoint_configs.get(name) is not None:
            raise ApiValidationError(
                f'Cannot create already existing endpoint configuration "{self.context.arn("endpoint-config", name)}".'
            )
        for field, rows in (
            ("ProductionVariants", request.ProductionVariants),
            ("ShadowProductionVariants", request.ShadowProductionVariants or []),
        ):
            for index, variant in enumerate(rows):
                self.context.instance(variant.InstanceType, f"{field}[{index}].InstanceType")
                self.models.model(variant.ModelName)  # SageMaker checks the model exists, too
        document: EndpointConfigDocument = {
            "EndpointConfigName": name,
            "EndpointConfigArn": self.context.arn("endpoint-config", name),
            "CreationTime": self.context.clock(),
            "request": request.model_dump(mode="json", exclude_none=True),
        }
        self.context.state.endpoint_configs.put(name, document)
        return {"EndpointConfigArn": document["EndpointConfigArn"]}

    def config(self, name: str) -> EndpointConfigDocument:
        """The stored endpoint config, or SageMaker's not-found error."""
        document = self.context.state.endpoint_configs.get(name)
        if document is None:
            raise missing("endpoint configuration", self.context.arn("endpoint-config", name))
        return document

    def DescribeEndpointConfig(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.EndpointConfigNameInput, body, "DescribeEndpointConfig")
        document = self.config(request.EndpointConfigName)
        described = {key: value for key, value in document["request"].items() if key != "Tags"}
        return {
            **described,
            "EndpointConfigArn": document["EndpointConfigArn"],
            "CreationTime": document["CreationTime"],
        }

    def ListEndpointConfigs(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.ListInput, body, "ListEndpointConfigs")
        rows = [
            {
                "EndpointConfigName": d["EndpointConfigName"],
                "EndpointConfigArn": d["EndpointConfigArn"],
                "CreationTime": d["CreationTime"],
            }
            for d in self.context.state.endpoint_configs.all()
        ]
        chunk, token = page(
            sort_and_filter(rows, request, "EndpointConfigName"),
            request.NextToken,
            request.MaxResults,
        )
        return {"EndpointConfigs": chunk, **({"NextToken": token} if token else {})}

    def DeleteEndpointConfig(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.EndpointConfigNameInput, body, "DeleteEndpointConfig")
        if not self.context.state.endpoint_configs.delete(request.EndpointConfigName):
            raise missing(
                "endpoint configuration",
                self.context.arn("endpoint-config", request.EndpointConfigName),
            )
        return {}
