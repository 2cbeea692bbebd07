"""`fhmon inject`: KubeVirt's virtiofs containers of a manifest put under fhmon, text in,
text out, nothing else touched.

The plan is the webhook's (monitor/kubevirt/patch.py); here it is applied to the manifest's
text: YAML or JSON, one document or a stream of them, Pods or Lists of Pods. Why the text is
edited rather than re-serialised: every other document, pod, container and field stays
byte-for-byte as it was (comments included), so the edits go to spans of the original text
(monitor/kubevirt/spans.py).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import yaml

from monitor.kubevirt.containers import DEFAULT_SETTINGS, Settings
from monitor.kubevirt.patch import plan_document
from monitor.kubevirt.spans import Document, Edit, InjectError

__all__ = ["InjectError", "inject"]


def inject(text: str, settings: Settings = DEFAULT_SETTINGS) -> str:
    """`fhmon inject`: the text with its Pods' PVC virtiofs containers under fhmon.

    Output is input except for the spans that change; injecting twice equals injecting once.
    """
    try:
        return _inject(text, settings)
    except RecursionError:
        raise InjectError("the input is nested too deeply") from None


def _inject(text: str, settings: Settings) -> str:
    newline = "\r\n" if "\r\n" in text else "\n"
    if _looks_json(text):
        documents = list(_json_documents(text, newline, settings))
    else:
        documents = list(_yaml_documents(text, newline))
    edits: list[Edit] = []
    for document, value in documents:
        edits.extend(document.edits(plan_document(value, settings)))
    edits.sort(key=lambda e: e.start)
    for earlier, later in itertools.pairwise(edits):
        if earlier.end > later.start:
            raise InjectError("overlapping edits (please report this input)")
    out = text
    for edit in reversed(edits):
        out = out[:edit.start] + edit.text + out[edit.end:]
    return out


def _looks_json(text: str) -> bool:
    """JSON in, JSON out; YAML flow style (`{kind: Pod}`) also starts with a brace."""
    stripped = text.lstrip()
    if stripped[:1] not in ("{", "["):
        return False
    try:
        json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError:
        return False
    return True


def _yaml_documents(text: str, newline: str) -> Iterator[tuple[Document, Any]]:
    loader = yaml.SafeLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            yield Document(text, node, False, newline), loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise InjectError(f"not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def _json_documents(text: str, newline: str,
                    settings: Settings) -> Iterator[tuple[Document, Any]]:
    """One JSON value, or several one after another (a stream, like `kubectl get -o json`)."""
    decoder = json.JSONDecoder()
    at = 0
    while True:
        while at < len(text) and text[at] in " \t\r\n":
            at += 1
        if at >= len(text):
            return
        try:
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError as exc:
            raise InjectError(f"not valid JSON: {exc}") from None
        if plan_document(value, settings):
            # Spans through PyYAML (JSON is YAML flow), its marks indexing the whole text.
            try:
                node = yaml.compose(_blank_before(text[:end], at), Loader=yaml.SafeLoader)
            except yaml.YAMLError as exc:
                raise InjectError(f"JSON that PyYAML cannot read: {exc}") from None
            if node is not None:
                yield Document(text, node, True, newline), value
        at = end


def _blank_before(text: str, at: int) -> str:
    """`text` with everything before `at` blanked (newlines kept), so marks index `text`."""
    return "".join(c if c == "\n" else " " for c in text[:at]) + text[at:]
