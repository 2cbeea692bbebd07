"""Edits to spans of a YAML or JSON text, found through PyYAML's node marks.

`fhmon inject` promises that every other document, pod, container and field stays
byte-for-byte as it was (comments included), so a plan's operations (monitor/kubevirt/patch.py)
become replacements of the spans they touch, and new text is written in the style around it
(block or flow, the document's indentation and newlines) rather than re-serialising the whole.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from monitor.kubevirt.patch import Op
from monitor.kubevirt.pods import Path


class InjectError(ValueError):
    """The input is not YAML/JSON we can edit; the message says where."""


@dataclass(frozen=True, slots=True)
class Edit:
    start: int
    end: int
    text: str


class Document:
    """One document's node tree (for spans) and how new text is written into it."""

    def __init__(self, text: str, root: yaml.Node, is_json: bool, newline: str) -> None:
        self.text = text
        self.root = root
        self.is_json = is_json
        self.newline = newline
        self.json_indent = _json_indent(text, root) if is_json else 0

    def node_at(self, path: Path) -> yaml.Node:
        node = self.root
        for part in path:
            if isinstance(node, yaml.MappingNode):
                node = next(v for k, v in node.value if k.value == part)
            elif isinstance(node, yaml.SequenceNode):
                assert isinstance(part, int)
                node = node.value[part]
            else:
                raise InjectError(f"no {part!r} in the document's structure")
        return node

    def edits(self, ops: Sequence[Op]) -> list[Edit]:
        out: list[Edit] = []
        for op in ops:
            if op.op == "replace" and op.path[-1] != "-":
                node = self.node_at(op.path)
                if isinstance(node, yaml.ScalarNode):  # `volumes: null` / `volumes:`
                    parent = self.node_at(op.path[:-1])
                    out.append(self._set_key(parent, node, op.value))
                else:
                    out.append(Edit(node.start_mark.index, content_end(node),
                                     self.render(op.value, node)))
            elif op.path[-1] == "-":
                out.append(self._append(self.node_at(op.path[:-1]), op.value))
            else:
                parent = self.node_at(op.path[:-1])
                out.append(self._add_key(parent, str(op.path[-1]), op.value))
        return out

    def _flow(self, node: yaml.Node) -> bool:
        return self.is_json or bool(getattr(node, "flow_style", False))

    def render(self, value: Any, node: yaml.Node) -> str:
        """`value` written to sit where `node` starts."""
        if self._flow(node):
            return self._json(value, _line_indent(self.text, node.start_mark.index))
        return self._block(value, node.start_mark.column)

    def _json(self, value: Any, base: int) -> str:
        if self.json_indent:
            text = json.dumps(value, indent=self.json_indent, default=str)
        else:
            text = json.dumps(value, default=str)
        return (self.newline + " " * base).join(text.split("\n"))

    def _block(self, value: Any, column: int) -> str:
        text = yaml.dump(value, Dumper=_IndentedDumper, default_flow_style=False,
                         sort_keys=False, allow_unicode=True, width=10**6).rstrip("\n")
        return (self.newline + " " * column).join(text.split("\n"))

    def _append(self, seq: yaml.Node, value: Any) -> Edit:
        assert isinstance(seq, yaml.SequenceNode)
        if self._flow(seq):
            if not seq.value:
                closing = seq.end_mark.index - 1
                return Edit(closing, closing,
                             self._json(value, _line_indent(self.text, seq.start_mark.index)))
            last = seq.value[-1]
            at = content_end(last)
            base = _line_indent(self.text, last.start_mark.index)
            if "\n" in self.text[seq.start_mark.index:seq.end_mark.index]:
                separator = "," + self.newline + " " * base
            else:
                separator = ", "
            return Edit(at, at, separator + self._json(value, base))
        column = seq.start_mark.column
        at = content_end(seq)
        return Edit(at, at, self.newline + " " * column + "- " + self._block(value, column + 2))

    def _add_key(self, mapping: yaml.Node, key: str, value: Any) -> Edit:
        assert isinstance(mapping, yaml.MappingNode)
        if self._flow(mapping):
            entry = json.dumps(key) + ": "
            if not mapping.value:
                closing = mapping.end_mark.index - 1
                base = _line_indent(self.text, mapping.start_mark.index)
                return Edit(closing, closing, entry + self._json(value, base))
            last_key, last_value = mapping.value[-1]
            # After the last value, inside the braces: a flow mapping's own end is past "}".
            at = content_end(last_value)
            base = _line_indent(self.text, last_key.start_mark.index)
            multi_line = "\n" in self.text[mapping.start_mark.index:mapping.end_mark.index]
            separator = ("," + self.newline + " " * base) if multi_line else ", "
            return Edit(at, at, separator + entry + self._json(value, base))
        column = mapping.start_mark.column
        at = content_end(mapping)
        return Edit(at, at, self.newline + " " * column + self._keyed_block(key, value, column))

    def _set_key(self, mapping: yaml.Node, scalar: yaml.Node, value: Any) -> Edit:
        """Replace a null value (`key:` or `key: null`) by a collection."""
        if self._flow(mapping) or self._flow(scalar):
            base = _line_indent(self.text, scalar.start_mark.index)
            return Edit(scalar.start_mark.index, scalar.end_mark.index, self._json(value, base))
        key_node = next(k for k, v in mapping.value if v is scalar)
        # `key:` alone gives an empty scalar whose marks sit at the colon.
        end = max(scalar.end_mark.index, key_node.end_mark.index + 1)
        return Edit(key_node.start_mark.index, end,
                     self._keyed_block(str(key_node.value), value, key_node.start_mark.column))

    def _keyed_block(self, key: str, value: Any, column: int) -> str:
        head = key + ":"
        if isinstance(value, list) and value:
            inner = column + 2
            return head + self.newline + " " * inner + self._block(value, inner)
        return head + " " + self._json(value, column)


class _IndentedDumper(yaml.SafeDumper):  # type: ignore[misc]
    """Lists indented under their key, the way Kubernetes manifests are usually written."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def content_end(node: yaml.Node) -> int:
    """Where a node's own text ends: block collections' marks run on over comments."""
    if isinstance(node, yaml.MappingNode) and not node.flow_style and node.value:
        return content_end(node.value[-1][1])
    if isinstance(node, yaml.SequenceNode) and not node.flow_style and node.value:
        return content_end(node.value[-1])
    return int(node.end_mark.index)


def _line_indent(text: str, index: int) -> int:
    line_start = text.rfind("\n", 0, index) + 1
    line = text[line_start:index]
    return len(line) - len(line.lstrip(" "))


def _json_indent(text: str, root: yaml.Node) -> int:
    """The indentation step of pretty-printed JSON (0 for compact JSON)."""
    if isinstance(root, yaml.MappingNode) and root.value:
        first_key = root.value[0][0]
        if first_key.start_mark.line != root.start_mark.line:
            return max(1, _line_indent(text, first_key.start_mark.index)
                       - _line_indent(text, root.start_mark.index))
    return 0
