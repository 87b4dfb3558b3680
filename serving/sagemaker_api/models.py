"""SageMaker's model operations: CreateModel checks and stores a model (its containers as spec
entries, secrets sealed); an endpoint config's variants each take a snapshot of it, so deleting it
stops no endpoint (as on SageMaker).
"""

from __future__ import annotations

from typing import cast

from serving.errors import ApiValidationError
from serving.sagemaker_api import shapes
from serving.sagemaker_api.api_context import ApiContext, missing
from serving.sagemaker_api.resources import page, sort_and_filter
from serving.sagemaker_api.sealed import masked
from serving.sagemaker_api.stored import ApiJson, ModelDocument, ModelSnapshot
from serving.sagemaker_api.translate import check_model

__all__ = ["Models"]


class Models:
    """CreateModel, DescribeModel, ListModels, DeleteModel."""

    def __init__(self, context: ApiContext) -> None:
        self.context = context

    def CreateModel(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.CreateModelInput, body, "CreateModel")
        if self.context.state.models.get(request.ModelName) is not None:
            raise ApiValidationError(
                f'Cannot create already existing model "{self.context.arn("model", request.ModelName)}".'
            )
        if request.EnableNetworkIsolation is False and not self.context.container_egress:
            raise ApiValidationError(
                "EnableNetworkIsolation: false asks for outbound network for the model's containers, which this "
                "server allows none (its operator sets --container-egress-ports); leave it out, or true"
            )
        model = check_model(
            request, self.context.model_roots, self.context.allow_model_requirements
        )
        definitions = (
            [request.PrimaryContainer]
            if request.PrimaryContainer
            else list(request.Containers or [])
        )
        model["images"] = [definition.Image for definition in definitions if definition is not None]
        document: ModelDocument = {
            "ModelName": request.ModelName,
            "ModelArn": self.context.arn("model", request.ModelName),
            "CreationTime": self.context.clock(),
            "request": self.context.sealer.seal(request.model_dump(mode="json", exclude_none=True)),
            "model": cast(ModelSnapshot, self.context.sealer.seal(dict(model))),
        }
        self.context.state.models.put(request.ModelName, document)
        return {"ModelArn": document["ModelArn"]}

    def model(self, name: str) -> ModelDocument:
        """The stored model, or SageMaker's not-found error."""
        document = self.context.state.models.get(name)
        if document is None:
            raise missing("model", self.context.arn("model", name))
        return document

    def DescribeModel(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.ModelNameInput, body, "DescribeModel")
        document = self.model(request.ModelName)
        described = masked(
            {key: value for key, value in document["request"].items() if key != "Tags"}
        )
        return {
            **described,
            "ModelArn": document["ModelArn"],
            "CreationTime": document["CreationTime"],
        }

    def ListModels(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.ListInput, body, "ListModels")
        rows = [
            {
                "ModelName": d["ModelName"],
                "ModelArn": d["ModelArn"],
                "CreationTime": d["CreationTime"],
            }
            for d in self.context.state.models.all()
        ]
        chunk, token = page(
            sort_and_filter(rows, request, "ModelName"), request.NextToken, request.MaxResults
        )
        return {"Models": chunk, **({"NextToken": token} if token else {})}

    def DeleteModel(self, body: ApiJson) -> ApiJson:
        request = shapes.parse(shapes.ModelNameInput, body, "DeleteModel")
        if not self.context.state.models.delete(request.ModelName):
            raise missing("model", self.context.arn("model", request.ModelName))
        # as on SageMaker, endpoints already serving it keep serving (they hold their own copy)
        return {}
