"""Reading the YAML files users write (workflows, bench configs): safe, and strict about keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping holds the same key twice; ``first`` and ``second`` are where (YAML marks)."""

    def __init__(self, key: Any, first: yaml.Mark, second: yaml.Mark) -> None:
        super().__init__(problem=f"duplicate key {key!r}", problem_mark=second)
        self.key, self.first, self.second = key, first, second


class StrictLoader(yaml.SafeLoader):
    """The one loader of user YAML files (workflows, bench configs): YAML's safe loader (no
    tags, no code runs) that also rejects a key given twice in one mapping, at any depth (PyYAML keeps the last
    value and drops the first without a word). Merge keys (``<<: *base``) may still be
    overridden by the mapping's own keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue  # an unhashable key: the base loader reports it
                if first is not key_node:
                    raise DuplicateKeyError(key, first.start_mark, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def read_yaml(text: str) -> tuple[yaml.Node | None, Any]:
    """The composed node tree (for line numbers) and the data of a YAML file's text,
    parsed once with :class:`StrictLoader`. Raises yaml's errors (DuplicateKeyError too)."""
    loader = StrictLoader(text)
    try:
        node = loader.get_single_node()
        return node, (loader.construct_document(node) if node is not None else None)
    finally:
        loader.dispose()


class YamlFileError(ValueError):
    """A YAML file that cannot be read, in words naming the file and line."""


def parse_yaml(path: Path, text: str) -> tuple[yaml.Node | None, Any]:
    """:func:`read_yaml` of ``path``'s ``text``, its errors as :class:`YamlFileError` naming the
    file and line (a key given twice: both lines)."""
    try:
        return read_yaml(text)
    except DuplicateKeyError as e:
        first, second = f"{path}:{e.first.line + 1}", f"{path}:{e.second.line + 1}"
        raise YamlFileError(f"{second}: duplicate key '{e.key}': it is given at {first} and again at {second}, in "
                            "the same mapping; YAML would keep only the last value and drop the first without a "
                            "word. Keep one of them (merge their contents) or rename one") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise YamlFileError(f"{path}{line}: YAML syntax error: {e.problem or e}"
                            f"{' (' + e.context + ')' if e.context else ''}") from None
    except yaml.YAMLError as e:
        raise YamlFileError(f"{path}: YAML error: {e}") from None
