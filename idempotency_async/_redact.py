"""Credentials out of messages: every URL that reaches an error, a log line or the terminal
goes through :func:`redact_url` (or :func:`redact` for text that may hold URLs).

It works on text, not on a parsed URL, because the URLs that end up in messages are often
the ones that do not parse (a bad port, a malformed IPv6 host, an unknown scheme).  What is
hidden:

* the password of the user information (``redis://admin:PW@host`` → ``redis://admin:***@host``);
  user information without a colon is hidden whole (``redis://TOKEN@host``: some services
  hand out a token in that place);
* the values of query parameters whose name says they hold a secret
  (``?password=…``, ``?token=…``, ``?aws_secret_access_key=…``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import quote, unquote

__all__ = ["MASK", "redact", "redact_url", "secrets_in"]

MASK: Final = "***"

_SHORTEST: Final = 4
# scheme "://" then the authority's user information, up to the last "@" before the path,
# query or fragment starts.
_USERINFO: Final = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]*)@")
_SECRET_NAME: Final = (
    r"[A-Za-z0-9_.-]*(?:pass|pwd|secret|token|auth|credential|signature)[A-Za-z0-9_.-]*"
)
_SECRET_PARAM: Final = re.compile(rf"(?P<name>[?&;]{_SECRET_NAME}=)(?P<value>[^&;#\s'\"]*)", re.I)


def _mask_userinfo(match: re.Match[str]) -> str:
    user, colon, _password = match["userinfo"].partition(":")
    if not colon:
        return f"{match['scheme']}{MASK}@"
    return f"{match['scheme']}{user}:{MASK}@"


def redact_url(url: str) -> str:
    """``url`` with its password and secret query values replaced by ``***``.

    Safe on text that is not a valid URL: whatever looks like user information or a secret
    parameter is hidden, the rest (scheme, host, port, path) is kept so the message still
    says which URL is meant.
    """
    url = _USERINFO.sub(_mask_userinfo, url)
    return _SECRET_PARAM.sub(lambda match: f"{match['name']}{MASK}", url)


def secrets_in(url: str) -> tuple[str, ...]:
    """The secrets :func:`redact_url` hides in ``url``, as written and percent-decoded.

    A library's error message may quote one of them without the URL around it (a decoded
    password, a bad parameter value): :func:`redact` removes those too.
    """
    found: list[str] = []
    # Decoded too: a URL nested in a parameter (``?endpoint=http%3A%2F%2Fuser%3Apw%40host``).
    for text in (url, unquote(url)):
        for match in _USERINFO.finditer(text):
            user, colon, password = match["userinfo"].partition(":")
            found.append(password if colon else user)
        found += [match["value"] for match in _SECRET_PARAM.finditer(text)]
    variants = {form for secret in found for form in (secret, unquote(secret), quote(secret))}
    return tuple(sorted((secret for secret in variants if secret), key=len, reverse=True))


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with the credentials of every URL in it hidden, and each of ``secrets``.

    ``secrets`` are usually :func:`secrets_in` of the URL the text is about.  Those shorter
    than four characters are only hidden inside URLs: replacing every ``a`` of a message
    would make it unreadable, and such a secret is guessed faster than read anyway.
    """
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= _SHORTEST:
            text = text.replace(secret, MASK)
    return redact_url(text)
