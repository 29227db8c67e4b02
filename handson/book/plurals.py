"""A glued count agrees with its noun: "1 duplicate row", "2 duplicate rows".

Pages glue a measured count and type the noun after it ("{glue:text}`n`
duplicate rows"), so a run that counts one would print "1 duplicate rows". This
Sphinx extension fixes that once for every page: after the glue is pasted, a
pasted value of exactly 1 turns the plural noun in the next two words into its
singular. Only the nouns in `SINGULAR` change; anything else is left as typed.
"""

from __future__ import annotations

import re

from docutils import nodes

SINGULAR = {
    "acks": "ack", "assignments": "assignment", "attempts": "attempt",
    "commits": "commit", "crashes": "crash", "deaths": "death",
    "deliveries": "delivery", "documents": "document", "docs": "doc",
    "duplicates": "duplicate", "effects": "effect", "emails": "email",
    "enqueues": "enqueue", "entries": "entry", "events": "event", "ids": "id",
    "jobs": "job", "kills": "kill", "machines": "machine", "messages": "message",
    "orders": "order", "records": "record", "replicas": "replica",
    "rounds": "round", "rows": "row", "runs": "run", "saves": "save",
    "transactions": "transaction", "workers": "worker", "writes": "write",
}
_WORD = re.compile(r"[A-Za-z-]+(?![/\w])")


def singular_after_one(following: str) -> str:
    """`following` (the text after a glued 1) with its noun made singular.

    Looks at the first two words only: "duplicate rows were" -> "duplicate row
    were"; a phrase whose first two words hold no known plural is unchanged.
    """
    for i, m in enumerate(_WORD.finditer(following)):
        if i == 2:
            break
        word = m.group(0)
        if word in SINGULAR:
            return following[:m.start()] + SINGULAR[word] + following[m.end():]
    return following


def _pasted(node: nodes.Node) -> bool:
    return isinstance(node, nodes.inline) and "pasted-text" in node.get("classes", [])


def agree(app, doctree: nodes.document, docname: str) -> None:
    for node in list(doctree.findall(_pasted)):
        if node.astext().strip() != "1":
            continue
        parent = node.parent
        at = parent.index(node)
        if at + 1 >= len(parent.children):
            continue
        after = parent.children[at + 1]
        if not isinstance(after, nodes.Text) or not after.astext()[:1].isspace():
            continue
        fixed = singular_after_one(after.astext())
        if fixed != after.astext():
            parent.replace(after, nodes.Text(fixed))


def setup(app):
    app.connect("doctree-resolved", agree)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
