"""S3's XML: building responses by hand (small, predictable) and parsing request bodies
with limits (no DOCTYPE, bounded size, namespaces stripped)."""
from __future__ import annotations

import functools
import re
import time
import xml.etree.ElementTree as ET
from email.utils import formatdate
from xml.parsers import expat

from node.s3.errors import S3Error

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
MAX_XML_BODY_BYTES = 4 * 1024 * 1024
_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}
# \r too: a parser reads a literal CR (or CR LF) back as \n, another key than the one stored
_NEEDS_ESCAPE = re.compile(r'[&<>"\x00-\x08\x0b\x0c\x0d\x0e-\x1f]')


def escape(value: str) -> str:
    """XML text; control characters become character references (as S3 writes them)."""
    if _NEEDS_ESCAPE.search(value) is None:   # nearly every key: no substitution call
        return value
    return _NEEDS_ESCAPE.sub(lambda m: _ESCAPES.get(m.group(), f"&#x{ord(m.group()):x};"), value)


def el(tag: str, value: object) -> str:
    """<tag>value</tag>; booleans as true/false; a list of strings is joined as inner XML."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, list):
        text = "".join(value)
        return f"<{tag}>{text}</{tag}>"
    else:
        text = escape(str(value))
    return f"<{tag}>{text}</{tag}>"


def doc(root: str, *inner: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{NS}">'
            + "".join(inner) + f"</{root}>").encode()


def iso8601(ts_ns: int) -> str:
    """2026-12-01T10:15:00.000Z (listing dates): whole seconds, as S3 sends them and as
    HEAD's Last-Modified has them. With the milliseconds (until the twenty-fourth
    session) `aws s3 sync --exact-timestamps` found every file it had downloaded changed
    (it sets a file's time to whole seconds) and fetched them all again on every run."""
    return f"{_iso_seconds(ts_ns // 1_000_000_000)}.000Z"


@functools.lru_cache(maxsize=4096)
def _iso_seconds(secs: int) -> str:
    """strftime is most of a listing entry's cost; keys written together share seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))


def http_date(ts_ns: int) -> str:
    """Last-Modified form: Tue, 01 Dec 2026 10:15:00 GMT."""
    return formatdate(ts_ns // 1_000_000_000, usegmt=True)


def owner_xml(user: str, tag: str = "Owner") -> str:
    """<Owner> (or <Initiator>) naming a user by its id and display name (the same)."""
    return el(tag, [el("ID", user), el("DisplayName", user)])


class _DtdRefused(Exception):
    pass


def _refuse_dtd(*_args: object) -> None:
    raise _DtdRefused


def parse(body: bytes, root: str) -> ET.Element:
    """The document's root element, namespaces stripped; MalformedXML if it is not one
    well-formed <root> document of at most MAX_XML_BODY_BYTES."""
    if len(body) > MAX_XML_BODY_BYTES:
        raise S3Error("MalformedXML", f"XML body larger than {MAX_XML_BODY_BYTES} bytes")
    if b"<!DOCTYPE" in body.upper() or b"<!ENTITY" in body.upper():   # the common case, early
        raise S3Error("MalformedXML", "DOCTYPE and ENTITY declarations are not accepted")
    # ... and in any encoding the parser takes (a UTF-16 body passed the check above and
    # its entities expanded: 1.8 MB became 80 MB): the parser itself refuses a DTD
    # (a first pass of expat alone, which stops at a DOCTYPE's first bytes; a body
    # without one costs a second parse in C, milliseconds for the largest)
    scan = expat.ParserCreate()
    scan.StartDoctypeDeclHandler = _refuse_dtd
    scan.EntityDeclHandler = _refuse_dtd
    try:
        scan.Parse(body, True)
        top = ET.fromstring(body)
    except _DtdRefused:
        raise S3Error("MalformedXML", "DOCTYPE and ENTITY declarations are not accepted") from None
    except (ET.ParseError, expat.ExpatError, ValueError) as exc:   # ValueError: an encoding
        # expat does not take ("multi-byte encodings are not supported": UTF-32, ...)
        raise S3Error("MalformedXML", f"the XML you provided was not well-formed: {exc}") from None
    for e in top.iter():
        if isinstance(e.tag, str) and "}" in e.tag:
            e.tag = e.tag.split("}", 1)[1]
    if top.tag != root:
        raise S3Error("MalformedXML", f"expected a <{root}> document, got <{top.tag}>")
    return top


def child_text(e: ET.Element, tag: str) -> str | None:
    c = e.find(tag)
    return None if c is None else (c.text or "")
