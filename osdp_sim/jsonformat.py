"""The `format` and `version` keys every --json output starts with (docs/json.md).

Version 1 of each format is what docs/json.md documents; a change that renames, removes or
re-means a key raises the version, while added keys do not (consumers ignore keys they do not
know)."""

VERSION = 1


def stamped(command: str, obj: dict) -> dict:
    """obj with "format": "osdp-sim/<command>" and "version" first."""
    return {"format": f"osdp-sim/{command}", "version": VERSION, **obj}
