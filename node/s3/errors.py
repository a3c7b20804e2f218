"""S3 errors: a code, an HTTP status and a message, rendered as S3's XML error body."""
from __future__ import annotations

from xml.sax.saxutils import escape


class S3Error(Exception):
    """One S3 error answer (`code` as AWS spells it, e.g. NoSuchKey)."""

    def __init__(self, code: str, message: str, status: int = 400,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status = code, message, status
        self.headers = dict(headers or {})

    def to_xml(self, resource: str = "", request_id: str = "") -> bytes:
        return ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error>"
                f"<Code>{escape(self.code)}</Code><Message>{escape(self.message)}</Message>"
                f"<Resource>{escape(resource)}</Resource><RequestId>{escape(request_id)}"
                "</RequestId></Error>").encode()


def access_denied(message: str = "Access Denied") -> S3Error:
    return S3Error("AccessDenied", message, 403)


def bad_digest(message: str) -> S3Error:
    return S3Error("BadDigest", message, 400)
