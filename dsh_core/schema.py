"""Schemas: the author DSL, the enforced raw JSON Schema subset, and validation.

Two vocabularies meet here. Authors write the compact DSL (plain dicts, see
:func:`parameter_schema_to_json_schema`) or an attrs class; both compile to the
*raw subset* (:data:`JsonSchemaNode`), the only schema form the registry, the
model and Code Mode ever see. Raw schemas from elsewhere (MCP servers, dynamic
registration) are checked with :func:`assert_supported_json_schema`, which
rejects every keyword it would not enforce instead of ignoring it; wrapped in
:class:`RawSchema`, such a schema goes straight into ``define_tool``.
"""

from ._errors import JsonSchemaError, SchemaSpecError
from ._schema._attrs_params import schema_from_attrs_class, structure_args
from ._schema._dsl import parameter_schema_to_json_schema, value_schema_to_json_schema
from ._schema._raw import RawSchema
from ._schema._subset import JsonSchemaNode, assert_object_json_schema, assert_supported_json_schema
from ._schema._validate import compile_validator, validate_json_schema_value

__all__ = [
    "JsonSchemaError",
    "JsonSchemaNode",
    "RawSchema",
    "SchemaSpecError",
    "assert_object_json_schema",
    "assert_supported_json_schema",
    "compile_validator",
    "parameter_schema_to_json_schema",
    "schema_from_attrs_class",
    "structure_args",
    "validate_json_schema_value",
    "value_schema_to_json_schema",
]
