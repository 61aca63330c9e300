"""The rules for identifiers, one per kind, applied wherever one arrives: a request body, a URL
path, a file name, a setting. An id that one door accepts, every other door can address."""

from __future__ import annotations

import re

#: The end of the text. A pattern ends with this, not `$`: Python's `$` also matches before a
#: final newline, and JSON Schema's (JavaScript's) patterns have no `\Z`.
END = r"(?![\s\S])"

#: Document ids: 1 to 512 characters, none of them a control character (C0, DEL or C1). Any
#: other text is fine, `/` included: a file's path below a watched folder is its id.
MAX_DOC_ID_CHARS = 512
DOC_ID_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]+" + END
DOC_ID_RULE = f"1 to {MAX_DOC_ID_CHARS} characters, no control characters"

#: Job ids are the queue's own: 32 lowercase hex digits (a UUID4 without dashes).
JOB_ID_PATTERN = r"^[0-9a-f]{32}" + END
JOB_ID_RULE = "32 lowercase hexadecimal digits"

#: Collection names: letters, digits, `_`, `-` and `.`, not starting with `.`, at most 255. The
#: embedded store keeps a collection in a folder of that name, so nothing may climb out of it.
MAX_COLLECTION_CHARS = 255
COLLECTION_PATTERN = rf"^[A-Za-z0-9_-][A-Za-z0-9_.-]{{0,{MAX_COLLECTION_CHARS - 1}}}" + END
COLLECTION_RULE = (
    f"1 to {MAX_COLLECTION_CHARS} letters, digits, '_', '-' or '.', not starting with '.'"
)

_DOC_ID = re.compile(DOC_ID_PATTERN)
_JOB_ID = re.compile(JOB_ID_PATTERN)
_COLLECTION = re.compile(COLLECTION_PATTERN)


def doc_id_problem(value: str) -> str | None:
    """Why `value` is not a document id, or None when it is one."""
    if not value:
        return f"a document id must be {DOC_ID_RULE}; got an empty one"
    if len(value) > MAX_DOC_ID_CHARS:
        return f"a document id must be {DOC_ID_RULE}; got {len(value):,} characters"
    if not _DOC_ID.match(value):
        return f"a document id must be {DOC_ID_RULE}; got one with a control character"
    return None


def is_job_id(value: str) -> bool:
    return bool(_JOB_ID.match(value))


def collection_problem(value: str) -> str | None:
    """Why `value` is not a collection name, or None when it is one."""
    if _COLLECTION.match(value):
        return None
    return f"a collection name must be {COLLECTION_RULE}; got {value[:80]!r}"
