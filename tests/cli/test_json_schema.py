# JSON schema -> grammar: random sentences of each schema's grammar (tests/tools/grammar_sample.cpp, which
# walks the token masks as constrained decoding does) validate against the schema with python's
# jsonschema (formats checked), and what the converter cannot express is refused with the keyword named.
import json, os, pathlib, subprocess

import jsonschema
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
XPERT = pathlib.Path(os.environ.get("XPERT_BIN", ROOT / "build" / "xpert"))
SAMPLER = XPERT.parent / "tests" / "grammar_sample"

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}

SCHEMAS = {
    "person": PERSON,
    "scalars": {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}, {"type": "number"},
                                                 {"type": "integer"}, {"type": "string"}]},
    "enum_const": {"type": "object", "properties": {"color": {"enum": ["red", "green", 7, None, {"a": [1]}]},
                                                    "kind": {"const": "fixed \"quoted\""}},
                   "required": ["color", "kind"]},
    "formats": {"type": "object", "properties": {f: {"type": "string", "format": f} for f in
                                                 ["date", "time", "date-time", "uuid", "email", "hostname",
                                                  "ipv4", "uri"]},
                "required": ["date", "time", "date-time", "uuid", "email", "hostname", "ipv4", "uri"]},
    "int_ranges": {"type": "array", "minItems": 6, "maxItems": 6, "prefixItems": [
        {"type": "integer", "minimum": 7, "maximum": 1234},
        {"type": "integer", "minimum": -250, "maximum": -3},
        {"type": "integer", "exclusiveMinimum": -20, "exclusiveMaximum": 20},
        {"type": "integer", "minimum": 99},
        {"type": "integer", "maximum": -5},
        {"type": "integer", "minimum": -1000000, "maximum": 999}]},
    "number_ranges": {"type": "array", "prefixItems": [
        {"type": "number", "minimum": 0, "maximum": 1},
        {"type": "number", "minimum": -3, "maximum": 2},
        {"type": "number", "minimum": -10, "maximum": -2},
        {"type": "number", "minimum": 5},
        {"type": "number", "maximum": -1},
        {"type": "number", "minimum": 0.25, "exclusiveMaximum": 2.5},
        {"type": "number", "exclusiveMinimum": -1.5, "maximum": -0.125}], "minItems": 7},
    "any_of": {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3},
                                                    {"type": "object", "properties": {"x": {"type": "boolean"}},
                                                     "required": ["x"]}]}, "maxItems": 4},
    "one_of_types": {"oneOf": [{"type": "null"}, {"type": ["integer", "boolean"]}]},
    "defs_recursive": {
        "$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"},
                                                             "children": {"type": "array", "maxItems": 2,
                                                                          "items": {"$ref": "#/$defs/node"}}},
                           "required": ["value"], "additionalProperties": False}},
        "$ref": "#/$defs/node"},
    "definitions": {"definitions": {"id": {"type": "string", "format": "uuid"}},
                    "type": "object", "properties": {"ids": {"type": "array", "items": {"$ref": "#/definitions/id"}}},
                    "required": ["ids"]},
    "additional_true": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                        "additionalProperties": True},
    "additional_schema": {"type": "object", "properties": {"ab": {"type": "string"}, "b": {"type": "null"}},
                          "additionalProperties": {"type": "integer"}},
    "optional_only": {"type": "object", "properties": {"p": {"type": "integer"}, "q": {"type": "boolean"},
                                                       "r": {"type": "null"}}},
    "nested": {"type": "object", "properties": {"outer": {"type": "object", "properties": {
        "inner": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
                  "maxItems": 2}}, "required": ["inner"]}}, "required": ["outer"]},
    "all_of": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                         {"properties": {"b": {"type": "string", "maxLength": 2}}, "required": ["b"]}]},
    "patterns": {"type": "array", "prefixItems": [
        {"type": "string", "pattern": "^[A-Z]{2}-\\d{3,4}$"},
        {"type": "string", "pattern": "^(foo|ba[rz])+(\\.[a-c]?)*$"},
        {"type": "string", "pattern": "^x\"y\\\\z$"},
        {"type": "string", "pattern": "[0-9]"},  # unanchored: contains a digit
        {"type": "string", "pattern": "^[^a-z\\\\]{1,3}$"},
        {"type": "string", "pattern": "^\\w+@\\S{2}\\s?.$"}], "minItems": 6, "items": False},
    "min_length": {"type": "string", "minLength": 3},
    "empty": {},
    "unicode_names": {"type": "object", "properties": {"clé": {"type": "integer"}, "名前": {"type": "string"}},
                      "required": ["clé", "名前"], "additionalProperties": {"type": "boolean"}},
}


@pytest.fixture(scope="module")
def sampler():
    if not SAMPLER.exists():
        pytest.fail(f"{SAMPLER} is missing: build first")
    return SAMPLER


def sample(sampler, tmp_path, schema, n, seed):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    r = subprocess.run([str(sampler), str(path), str(n), str(seed)], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_random_sentences_validate(sampler, tmp_path, name):
    schema = SCHEMAS[name]
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    texts = sample(sampler, tmp_path, schema, 40, 1234)
    assert len(texts) >= 30, f"only {len(texts)} of 40 walks finished"
    for text in texts:
        value = json.loads(text)
        errors = [e.message for e in validator.iter_errors(value)]
        assert not errors, f"{text!r}: {errors}"
    assert len(set(texts)) > len(texts) // 2  # the walks explore


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "integer", "multipleOf": 3}, "multipleOf"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "object", "patternProperties": {"^a": {}}}, "patternProperties"),
    ({"type": "string", "format": "ipv6"}, "format"),
    ({"type": "string", "pattern": "(?=a)b"}, "pattern"),
    ({"type": "string", "pattern": "a\\bc"}, "pattern"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "maxLength"),
    ({"type": "number", "minimum": 1e-20}, "minimum"),  # more fraction digits than a grammar bound takes
    ({"$ref": "#/$defs/missing"}, "$ref"),
    ({"$ref": "https://example.com/s.json"}, "$ref"),
    ({"type": "string", "minimum": 3}, "minimum"),
    ({"type": "wat"}, "type"),
    (False, "false"),
    ({"allOf": [{"properties": {"a": {}}}], "additionalProperties": False}, "additionalProperties"),
    ({"allOf": [{"properties": {"a": {"type": "string"}}}, {"properties": {"a": {"type": "integer"}}}]}, "allOf"),
])
def test_unsupported_keywords_are_named(sampler, tmp_path, schema, keyword):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    r = subprocess.run([str(sampler), str(path), "1", "1"], capture_output=True, timeout=60)
    assert r.returncode == 1
    assert keyword in r.stderr.decode(), r.stderr.decode()
