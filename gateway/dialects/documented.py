"""The dialects' part of the OpenAPI document: their paths and schemas (gateway/openapi.py adds them).

Written next to the dialect modules, which check exactly what is promised
here; the error answers come from the error table in each dialect's shape
and statuses (gateway/openapi_parts.py).
"""

from __future__ import annotations

from typing import Any

from gateway.dialects import Dialect
from gateway.dialects.tensors import HEADER_LENGTH
from gateway.openapi_parts import (
    BROKER_QUERY_ERRORS,
    answer,
    errors_for,
    get,
    inference,
    json_body,
    model_parameter,
    ref,
)

EXAMPLE_MODEL = "all-MiniLM-L6-v2"
TEXT = {"type": "string", "minLength": 1}
TEXTS = {"oneOf": [TEXT, {"type": "array", "minItems": 1, "items": TEXT}]}
NUMBERS = {"type": "array", "items": {"type": "number"}}
FLAG = {"type": "boolean", "nullable": True}
DIRECTION = {"type": "string", "enum": ["left", "right", "Left", "Right"], "default": "right"}
TRUNCATION = {"truncate": {**FLAG, "description": "Cut inputs longer than the model's maximum (default true); "
                                                  "false refuses them"},
              "truncation_direction": DIRECTION}
LABELLED = {"type": "object", "required": ["label", "score"],
            "properties": {"label": {"type": "string"}, "score": {"type": "number"}}}
TEI_ERRORS = ("Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty")
OPENAI, TEI, KSERVE = Dialect.OPENAI, Dialect.TEI, Dialect.KSERVE


def _object(required: list[str], properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    """An object schema (OpenAPI 3.0 wants no empty ``required``)."""
    return {"type": "object", **({"required": required} if required else {}), "properties": properties, **more}


SCHEMAS: dict[str, Any] = {
    "OpenAIError": _object(["error"], {"error": _object(["message", "type", "param", "code"], {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": "string", "nullable": True}, "code": {"type": "string"}})}),
    "TEIError": _object(["error", "error_type"], {"error": {"type": "string"},
                                                  "error_type": {"type": "string", "enum": list(TEI_ERRORS)}}),
    "KServeError": _object(["error"], {"error": {"type": "string"}}),
    # OpenAI
    "OpenAIModel": _object(["id", "object", "created", "owned_by"], {
        "id": {"type": "string"}, "object": {"type": "string", "enum": ["model"]},
        "created": {"type": "integer"}, "owned_by": {"type": "string"}}),
    "OpenAIModelList": _object(["object", "data"], {"object": {"type": "string", "enum": ["list"]},
                                                    "data": {"type": "array", "items": ref("OpenAIModel")}}),
    # TEI
    "EmbedRequest": _object(["inputs"], {"inputs": TEXTS, "normalize": FLAG,
                                         "dimensions": {"type": "integer", "minimum": 1, "nullable": True},
                                         **TRUNCATION}, example={"inputs": ["What is Deep Learning?"]}),
    "RerankRequest": _object(["query", "texts"], {
        "query": TEXT, "texts": {"type": "array", "minItems": 1, "items": TEXT}, "raw_scores": FLAG,
        "return_text": FLAG, **TRUNCATION}, example={"query": "What is Deep Learning?",
                                                      "texts": ["Deep Learning is...", "Cheese is..."]}),
    "Rank": _object(["index", "score"], {"index": {"type": "integer", "minimum": 0}, "score": {"type": "number"},
                                         "text": {"type": "string"}}),
    "PredictRequest": _object(["inputs"], {
        "inputs": {"oneOf": [TEXT, {"type": "array", "minItems": 1, "maxItems": 2, "items": TEXT},
                             {"type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1,
                                                                        "maxItems": 2, "items": TEXT}}],
                   "description": "A text, a pair [text, text_pair], or a batch of [text] and [text, text_pair]"},
        "raw_scores": FLAG, **TRUNCATION}, example={"inputs": "I like you."}),
    "SimilarityRequest": _object(["inputs"], {
        "inputs": _object(["source_sentence", "sentences"], {
            "source_sentence": TEXT, "sentences": {"type": "array", "minItems": 1, "items": TEXT}}),
        "parameters": {"type": "object", "nullable": True, "properties": TRUNCATION}}),
    "TokenizeRequest": _object(["inputs"], {"inputs": TEXTS, "add_special_tokens": FLAG},
                               example={"inputs": "test"}),
    "SimpleToken": _object(["id", "text", "special"], {
        "id": {"type": "integer"}, "text": {"type": "string"}, "special": {"type": "boolean"},
        "start": {"type": "integer", "nullable": True, "description": "In code points"},
        "stop": {"type": "integer", "nullable": True}}),
    "Info": _object(["model_id", "model_dtype", "model_type", "max_input_length", "max_client_batch_size",
                     "version"], {
        "model_id": {"type": "string"}, "model_dtype": {"type": "string"}, "model_type": {"type": "object"},
        "max_concurrent_requests": {"type": "integer"}, "max_input_length": {"type": "integer"},
        "max_batch_tokens": {"type": "integer"}, "max_batch_requests": {"type": "integer", "nullable": True},
        "max_client_batch_size": {"type": "integer"}, "auto_truncate": {"type": "boolean"},
        "tokenization_workers": {"type": "integer"}, "version": {"type": "string"},
        "served_model_name": {"type": "string"}}),
    # KServe v2
    "ServerMetadata": _object(["name", "version", "extensions"], {
        "name": {"type": "string"}, "version": {"type": "string"},
        "extensions": {"type": "array", "items": {"type": "string"}}}),
    "TensorMetadata": _object(["name", "datatype", "shape"], {
        "name": {"type": "string"}, "datatype": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}}}),
    "ModelMetadata": _object(["name", "platform", "inputs", "outputs"], {
        "name": {"type": "string"}, "versions": {"type": "array", "items": {"type": "string"}},
        "platform": {"type": "string", "description": "zbatch/TASK"},
        "inputs": {"type": "array", "items": ref("TensorMetadata")},
        "outputs": {"type": "array", "items": ref("TensorMetadata")}}),
    "InferenceRequest": _object(["inputs"], {
        "id": {"type": "string"},
        "parameters": {"type": "object", "description": "The task's parameters; binary_data_output"},
        "inputs": {"type": "array", "minItems": 1, "items": _object(["name", "datatype", "shape"], {
            "name": {"type": "string"}, "datatype": {"type": "string", "enum": ["BYTES"]},
            "shape": {"type": "array", "minItems": 1, "maxItems": 8, "items": {"type": "integer", "minimum": 0}},
            "parameters": _object([], {"binary_data_size": {"type": "integer", "minimum": 0}}),
            "data": {"type": "array", "items": {}}})},
        "outputs": {"type": "array", "items": _object(["name"], {
            "name": {"type": "string"}, "parameters": _object([], {"binary_data": {"type": "boolean"}})})}},
        example={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]}),
    "InferenceResponse": _object(["model_name", "outputs"], {
        "model_name": {"type": "string"}, "model_version": {"type": "string"}, "id": {"type": "string"},
        "outputs": {"type": "array", "items": _object(["name", "datatype", "shape"], {
            "name": {"type": "string"}, "datatype": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}}, "data": {"type": "array", "items": {}},
            "parameters": _object([], {"binary_data_size": {"type": "integer"}})})}}),
}

HEADER_LENGTH_PARAMETER = {
    "name": HEADER_LENGTH, "in": "header", "required": False,
    "description": "Binary form (Triton's binary tensor extension): the length of the JSON part of the body; "
                   "the inputs' binary data follows it",
    "schema": {"type": "string", "pattern": "^[0-9]{1,10}$"}}
TEI_HEADERS = ("x-compute-tokens", "x-compute-characters")


def tei_inference(summary: str, schema: str, ok: dict[str, Any]) -> dict[str, Any]:
    """A TEI inference route: its answer carries TEI's counts too."""
    for name in TEI_HEADERS:
        ok["headers"][name] = {"description": f"TEI's {name}", "schema": {"type": "integer"}}
    return inference(summary, json_body(schema), ok, dialect=TEI)


PATHS: dict[str, Any] = {
    "/v1/models": get("OpenAI: the models a worker serves", answer("Models", ref("OpenAIModelList")),
                      *BROKER_QUERY_ERRORS, dialect=OPENAI),
    "/v1/models/{model}": get("OpenAI: one model a worker serves", answer("The model", ref("OpenAIModel")),
                              *BROKER_QUERY_ERRORS, "unknown_model", dialect=OPENAI,
                              parameters=(model_parameter(EXAMPLE_MODEL),)),
    "/embed": tei_inference("TEI: embeddings, always a list of vectors (ZBATCH_TEI_MODEL)", "EmbedRequest",
                            answer("One vector per input", {"type": "array", "items": NUMBERS}, tokens=True)),
    "/rerank": tei_inference("TEI: texts ranked against a query, highest score first (ZBATCH_TEI_RERANK_MODEL)",
                             "RerankRequest", answer("Ranks", {"type": "array", "items": ref("Rank")},
                                                     tokens=True)),
    "/predict": tei_inference(
        "TEI: every label and its score, highest first, for a text or pair; a list of those for a batch "
        "(ZBATCH_TEI_PREDICT_MODEL)", "PredictRequest",
        answer("Predictions", {"oneOf": [{"type": "array", "items": LABELLED},
                                         {"type": "array", "items": {"type": "array", "items": LABELLED}}]},
               tokens=True)),
    "/similarity": tei_inference("TEI: cosine similarity of each sentence with the source (ZBATCH_TEI_MODEL)",
                                 "SimilarityRequest", answer("One similarity per sentence", NUMBERS, tokens=True)),
    "/tokenize": tei_inference("TEI: each input's tokens (ZBATCH_TEI_MODEL)", "TokenizeRequest",
                               answer("Tokens per input", {"type": "array", "items": {
                                   "type": "array", "items": ref("SimpleToken")}}, tokens=True)),
    "/info": get("TEI: the TEI model, as the workers describe it", answer("Info", ref("Info")),
                 *BROKER_QUERY_ERRORS, "unknown_model", dialect=TEI),
    "/health": {"get": {"summary": "TEI: 200, no body, while a worker serves the TEI model",
                        "parameters": [{"$ref": "#/components/parameters/RequestId"}],
                        "responses": {"200": {"description": "Healthy"},
                                      **errors_for(*BROKER_QUERY_ERRORS, "no_worker", dialect=TEI)}}},
    "/v2": get("KServe v2: the server's name, version and extensions", answer("Server", ref("ServerMetadata")),
               "unauthorized", dialect=KSERVE),
    "/v2/health/live": get("KServe v2: live while the gateway answers",
                           answer("Live", _object(["live"], {"live": {"type": "boolean"}})),
                           "unauthorized", dialect=KSERVE),
    "/v2/health/ready": get("KServe v2: ready as /readyz",
                            answer("Ready", _object(["ready"], {"ready": {"type": "boolean"}})),
                            *BROKER_QUERY_ERRORS, "no_worker", dialect=KSERVE),
    "/v2/models/{model}": get("KServe v2: the model's input and output tensors, from its task",
                              answer("Model", ref("ModelMetadata")), *BROKER_QUERY_ERRORS, "unknown_model",
                              dialect=KSERVE, parameters=(model_parameter(EXAMPLE_MODEL),)),
    "/v2/models/{model}/ready": get("KServe v2: ready while a worker serves the model",
                                    answer("Ready", _object(["name", "ready"], {"name": {"type": "string"},
                                                                                "ready": {"type": "boolean"}})),
                                    *BROKER_QUERY_ERRORS, "unknown_model", "no_worker", dialect=KSERVE,
                                    parameters=(model_parameter(EXAMPLE_MODEL),)),
    "/v2/models/{model}/infer": inference(
        "KServe v2: run the model on its tensors, JSON or binary (tritonclient's default)",
        {"application/json": {"schema": ref("InferenceRequest")},
         "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        {**answer("Outputs: JSON, or in the binary form the JSON part (its length in "
                  f"{HEADER_LENGTH}) and then the binary outputs", ref("InferenceResponse"), tokens=True),
         "content": {"application/json": {"schema": ref("InferenceResponse")},
                     "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
        model_parameter(EXAMPLE_MODEL), HEADER_LENGTH_PARAMETER, dialect=KSERVE),
}
