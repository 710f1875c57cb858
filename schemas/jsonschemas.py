"""Generate and compare the committed JSON Schemas (``schemas/jsonschema/*.json``).

Run ``python -m schemas.jsonschemas`` after changing a model; the drift test fails
until the committed files match the models.
"""

from __future__ import annotations

import json
from pathlib import Path

from schemas import MESSAGE_MODELS
from schemas._base import Message

__all__ = ["SCHEMA_DIR", "render", "write_all"]

SCHEMA_DIR = Path(__file__).parent / "jsonschema"


def render(model: type[Message]) -> str:
    schema = model.model_json_schema(mode="serialization")
    version = model.model_fields["schema_version"].default
    schema["$id"] = f"https://stepguard.dev/schemas/{model.kind_name}.v{version}.json"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_all(directory: Path = SCHEMA_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for model in MESSAGE_MODELS:
        path = directory / f"{model.kind_name}.json"
        path.write_text(render(model))
        written.append(path)
    return written


if __name__ == "__main__":
    for p in write_all():
        print(p)
