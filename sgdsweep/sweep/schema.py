"""The configuration schema: loading it, validating against it, filling its defaults.

The schema lives in ``workflow/schemas/config.schema.yaml`` (a copy ships in the wheel). Errors
are turned into :class:`~sgdsweep.errors.ConfigError` naming the key, the value given and what
is allowed, with a "did you mean" for misspelled keys.
"""

from __future__ import annotations

import copy
import difflib
import functools
import math
import re
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from jsonschema import validators
from jsonschema.exceptions import ValidationError, best_match

from sgdsweep.core.paths import workflow_root
from sgdsweep.errors import ConfigError
from sgdsweep.sweep import limits


@functools.lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    """The config JSON schema as a dict (read once; by libyaml's safe loader where PyYAML has it:
    0.01 s instead of 0.1 s in every process that checks a config)."""
    path = workflow_root() / "workflow" / "schemas" / "config.schema.yaml"
    with open(path, encoding="utf-8") as fh:
        return yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _extend_with_default(validator_class: type) -> type:
    """A validator class that also fills each property's ``default`` into the instance."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if "default" in subschema and name not in instance:
                    instance[name] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return validators.extend(validator_class, {"properties": set_defaults})


_DefaultFillingValidator = _extend_with_default(jsonschema.Draft202012Validator)

#: Names from the papers and other tools, mapped to sgdsweep's one name per concept.
ALIASES = {
    "learning_rate": "lr", "eta": "lr", "alpha": "lr", "step_size": "lr", "epsilon": "lr",
    "batch": "batch_size", "batchsize": "batch_size", "minibatch_size": "batch_size",
    "mu": "momentum", "beta": "momentum",
    "p_over_n": "samples_per_param", "alpha_data": "samples_per_param", "n_samples": "samples_per_param",
    "width": "hidden_width", "n_hidden": "hidden_width", "hidden": "hidden_width",
    "noise_type": "noise", "sigma": "label_noise", "n": "n_inputs", "dim": "n_inputs",
    "n_steps": "steps", "iterations": "steps", "n_replicas": "replicas", "burnin": "burn_in",
}


def suggest(name: str, allowed: list[str]) -> str | None:
    """The allowed key that ``name`` most likely meant, if any."""
    alias = ALIASES.get(name.lower())
    if alias in allowed:
        return alias
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.5)
    return close[0] if close else None


def key_path(parts: Iterable[object]) -> str:
    """``['grid', 'lr', 2]`` → ``'grid.lr[2]'``; an empty path is ``'<config>'``."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<config>"


def _constraint_words(error: ValidationError) -> str:
    """What the failed keyword allows, in words."""
    schema, kw = error.schema, error.validator
    if kw == "enum":
        return "one of " + ", ".join(repr(v) for v in error.validator_value)
    if kw == "const":
        return repr(error.validator_value)
    if kw == "type":
        return f"a value of type {error.validator_value}"
    if kw in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        parts = []
        if "minimum" in schema:
            parts.append(f">= {schema['minimum']}")
        if "exclusiveMinimum" in schema:
            parts.append(f"> {schema['exclusiveMinimum']}")
        if "maximum" in schema:
            parts.append(f"<= {schema['maximum']}")
        if "exclusiveMaximum" in schema:
            parts.append(f"< {schema['exclusiveMaximum']}")
        return "a number " + " and ".join(parts)
    if kw == "minItems":
        return f"a list of at least {error.validator_value} value(s)"
    if kw == "minLength":
        return f"a string of at least {error.validator_value} character(s)"
    if kw == "pattern":
        return f"a string matching {error.validator_value!r}"
    if kw == "minProperties":
        return f"a mapping with at least {error.validator_value} key(s)"
    if kw == "oneOf":
        return "a single value or a non-empty list of values"
    return error.message


def _branch_errors(error: ValidationError) -> list[ValidationError] | None:
    """For a failed ``oneOf`` "value or list of values": the errors of the branch that fits the
    instance's shape (the list branch for a list, the scalar branch otherwise)."""
    branches = error.validator_value
    want_array = isinstance(error.instance, list)
    chosen = [i for i, b in enumerate(branches) if (b.get("type") == "array") == want_array]
    if len(chosen) != 1:
        return None
    errs = [e for e in error.context if e.relative_schema_path and e.relative_schema_path[0] == chosen[0]]
    return errs or None


def _to_config_error(error: ValidationError) -> ConfigError:
    if error.validator == "oneOf" and error.context:
        branch = _branch_errors(error)
        if branch:
            return _to_config_error(best_match(branch))
        words = " or ".join(dict.fromkeys(_constraint_words(e) for e in error.context))
        desc = " ".join((error.schema.get("description") or "").split())
        return ConfigError(key_path(error.absolute_path), error.instance,
                           words + (f" ({desc})" if desc else ""))
    path = list(error.absolute_path)
    key = key_path(path)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        unexpected = sorted(set(error.instance) - set(allowed))
        name = unexpected[0]
        close = suggest(name, allowed)
        hint = f"Did you mean '{close}'?" if close else "Remove it or check its spelling."
        return ConfigError(key_path(path + [name]), error.instance[name],
                           "known keys: " + ", ".join(allowed), f"Unknown key. {hint}")
    if error.validator == "required":
        return ConfigError(key, None, f"the key(s) {error.validator_value}", "A required key is missing.")
    description = " ".join(error.schema.get("description", "").split())
    allowed = _constraint_words(error)
    if description and error.validator not in ("additionalProperties",):
        allowed = f"{allowed} ({description})"
    return ConfigError(key, error.instance, allowed)


_EXPONENT_FLOAT = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)[eE][-+]?\d+$")


def _takes_numbers(schema: Any, defs: dict[str, Any]) -> bool:
    """Whether a value of ``schema`` (a number, or a list or nesting of them) may be a number."""
    if not isinstance(schema, dict):
        return False
    if "$ref" in schema:
        return _takes_numbers(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    types = schema.get("type", [])
    if "number" in (types if isinstance(types, list) else [types]):
        return True
    return _takes_numbers(schema.get("items"), defs) or any(_takes_numbers(b, defs) for b in schema.get("oneOf", []))


@functools.lru_cache(maxsize=1)
def number_keys() -> frozenset[str]:
    """The config keys whose values are numbers (or lists of them) somewhere in the schema.

    Their values written like ``1e-1`` are read as numbers: YAML 1.1 (PyYAML, Snakemake) hands
    them over as strings (no dot), while YAML 1.2 and every physicist read a number."""
    schema = load_schema()
    defs = schema.get("$defs", {})
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for name, sub in (node.get("properties") or {}).items():
                if _takes_numbers(sub, defs):
                    found.add(name)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return frozenset(found)


def _as_number(value: Any) -> Any:
    if isinstance(value, list):
        return [_as_number(v) for v in value]
    if isinstance(value, str) and _EXPONENT_FLOAT.match(value.strip()):
        return float(value)
    return value


def normalise_numbers(node: Any) -> Any:
    """Copy of ``node`` where the values of :func:`number_keys` written like ``1e-1`` are floats."""
    if isinstance(node, dict):
        return {k: normalise_numbers(_as_number(v) if k in number_keys() else v) for k, v in node.items()}
    if isinstance(node, list):
        return [normalise_numbers(v) for v in node]
    return node


def _deep_key(path: Iterable[object]) -> str:
    """The key of a value nested too deep: its path up to the last named key, then ``[…]``."""
    parts = [p for p in path if p is not None and p != "<key>"]
    named = [i for i, p in enumerate(parts) if isinstance(p, str)]
    return key_path(parts[: named[-1] + 1] if named else []) + "[…]"


def check_tree(node: Any) -> None:
    """Raise :class:`ConfigError` if a mapping or list occurs twice in ``node`` (a YAML alias
    that a loader other than :func:`read_yaml` let through, e.g. in Snakemake's ``--config``).

    Shared parts would be expanded by every walk over the config: nine lists of nine aliases
    make 9⁹ values from a few hundred bytes. The walk visits each object once, so it costs the
    size of what was loaded, never of its expansion. A value nested deeper than
    :data:`~sgdsweep.sweep.limits.MAX_DEPTH` is refused too (the recursive walks after this one
    would overflow Python's stack), and so is a string (key or value) longer than
    :data:`~sgdsweep.sweep.limits.MAX_STRING_CHARS`."""
    seen: dict[int, tuple] = {}
    queue: deque[tuple[Any, tuple]] = deque([(node, ())])  # breadth first: the shallowest repeat
    while queue:
        item, path = queue.popleft()
        if isinstance(item, str) and len(item) > limits.MAX_STRING_CHARS:
            raise limits.string_error(key_path(path), len(item))
        if not isinstance(item, (dict, list)):
            continue
        if id(item) in seen:
            raise ConfigError(key_path(path), f"the same {type(item).__name__} as {key_path(seen[id(item)])}",
                              "a value written out in full", "YAML anchors (&name) and aliases (*name) are "
                              "refused: nested aliases can expand a few hundred bytes into billions of values.")
        seen[id(item)] = path
        if len(path) >= limits.MAX_DEPTH:
            raise limits.depth_error(_deep_key(path), "")
        long_key = next((k for k in item if isinstance(k, str) and len(k) > limits.MAX_STRING_CHARS), None) \
            if isinstance(item, dict) else None
        if long_key is not None:
            raise limits.string_error(key_path((*path, long_key[:40] + "…")), len(long_key))
        children = item.items() if isinstance(item, dict) else enumerate(item)
        queue.extend((v, (*path, k)) for k, v in children)


def check_keys_and_numbers(node: Any, path: tuple = ()) -> None:
    """Raise :class:`ConfigError` for a key that is not a string or a number that is not finite
    (YAML reads ``.nan``, ``.inf`` and numbers beyond ±1.8e308 as such), anywhere in ``node``."""
    if isinstance(node, dict):
        for k, v in node.items():
            if not isinstance(k, str):
                raise ConfigError(key_path((*path, str(k))), k, "a key that is a name, such as 'lr'",
                                  f"YAML read this key as {type(k).__name__}; check the indentation above it, "
                                  "or quote it if it is meant as a name.")
            check_keys_and_numbers(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            check_keys_and_numbers(v, (*path, i))
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(key_path(path), node, "a finite number",
                          "YAML reads .nan, .inf and numbers beyond ±1.8e308 as not finite.")


def validate_and_fill(raw: dict[str, Any]) -> dict[str, Any]:
    """Validate ``raw`` against the schema; return a deep copy with every default filled in.

    Raises:
        ConfigError: for the most relevant schema violation.
    """
    if not isinstance(raw, dict):
        raise ConfigError("<config>", raw, "a YAML mapping of keys to values (e.g. 'grid: {...}')")
    check_tree(raw)  # first: the walks below would expand shared parts
    filled = normalise_numbers(copy.deepcopy(raw))
    check_keys_and_numbers(filled)
    validator = _DefaultFillingValidator(load_schema())
    error = best_match(validator.iter_errors(filled))
    if error is not None:
        raise _to_config_error(error)
    return filled


class _AliasError(yaml.YAMLError):
    """An anchor (``&name``) or alias (``*name``) in a config file, at ``mark``."""

    def __init__(self, what: str, mark: yaml.Mark) -> None:
        super().__init__(what)
        self.what, self.mark = what, mark


class _LimitError(yaml.YAMLError):
    """A config file beyond a limit of :mod:`sgdsweep.sweep.limits`, met while parsing it."""

    def __init__(self, error: ConfigError) -> None:
        super().__init__(str(error))
        self.error = error


def _at(mark: yaml.Mark) -> str:
    return f"Line {mark.line + 1}, column {mark.column + 1}. "


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated in one mapping (PyYAML keeps the last one
    silently: a second ``sweep:`` would send the results to another sweep's directory), and any
    anchor or alias: a few hundred bytes of nested aliases ("billion laughs") expand to billions
    of values in whatever walks the result. They are refused as the parser meets them, before
    anything is built."""

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        event = self.peek_event()
        if event.anchor is not None:
            sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
            raise _AliasError(f"{'alias' if sign == '*' else 'anchor'} {sign}{event.anchor}", event.start_mark)
        path = self.__dict__.setdefault("_path", [])
        self._nodes = self.__dict__.get("_nodes", 0) + 1
        part = index.value if isinstance(index, yaml.ScalarNode) else index
        if isinstance(part, int) and part >= limits.MAX_LIST_ITEMS:
            raise _LimitError(limits.list_error(key_path(p for p in path if p not in (None, "<key>")),
                                                 _at(event.start_mark)))
        if self._nodes > limits.MAX_NODES:
            raise _LimitError(limits.nodes_error(_at(event.start_mark)))
        if len(path) > limits.MAX_DEPTH and not isinstance(event, yaml.ScalarEvent):
            raise _LimitError(limits.depth_error(_deep_key(path), _at(event.start_mark)))
        path.append("<key>" if index is None and isinstance(parent, yaml.MappingNode) else part)
        try:
            return super().compose_node(parent, index)
        finally:
            path.pop()

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):  # an unhashable key fails in PyYAML itself
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found the key {key!r} twice (the second one is here)", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file safely (a ``yaml.SafeLoader`` that also refuses a repeated key),
    with clear errors."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("<config file>", str(path), "an existing YAML file",
                          "Check the path (it is relative to the working directory).")
    size = p.stat().st_size
    if size > limits.MAX_FILE_BYTES:
        raise limits.file_size_error(str(path), size)
    try:
        with open(p, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=_UniqueKeyLoader)  # a SafeLoader: no Python tags
    except _LimitError as exc:
        raise exc.error from None
    except UnicodeDecodeError as exc:
        raise ConfigError("<config file>", str(path), "a UTF-8 encoded YAML file",
                          f"Byte {exc.start} is not UTF-8 ({exc.reason}); save the file as UTF-8.") from None
    except _AliasError as exc:
        raise ConfigError("<config file>", str(path), "YAML without anchors (&name) or aliases (*name)",
                          f"Line {exc.mark.line + 1}, column {exc.mark.column + 1} has the {exc.what}; sgdsweep "
                          "refuses them (nested aliases can expand a few hundred bytes into billions of values). "
                          "Write the values out in full.") from None
    except yaml.YAMLError as exc:
        raise ConfigError("<config file>", str(path), "valid YAML", f"YAML parse error: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("<config>", data, "a YAML mapping of keys to values")
    return data
