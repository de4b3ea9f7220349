"""Credentials out of messages: every URL that reaches an error, a log line or the terminal
goes through :func:`redact_url` (or :func:`redact` for text that may hold URLs).

It works on text, not on a parsed URL, because the URLs that end up in messages are often
the ones that do not parse (a bad port, a malformed IPv6 host, an unknown scheme).  What is
hidden:

* the password of the user information (``redis://admin:PW@host`` → ``redis://admin:***@host``);
  user information without a colon is hidden whole (``redis://TOKEN@host``: some services
  hand out a token in that place).  The user information runs to the *last* ``@`` of the
  URL, so a password holding ``/``, ``?``, ``#``, ``@`` (or, in a URL given on its own or
  quoted in a message, a space) is hidden whole — the malformed URLs that reach error
  messages are exactly those.  The price: a ``@`` in a query value
  (``redis://host/0?x=a@b``) is taken for the end of a password, and the text before it is
  hidden too;
* the values of query parameters whose name says they hold a secret
  (``?password=…``, ``?token=…``, ``?aws_secret_access_key=…``);
* AWS session tokens written as a header or a canonical-request line
  (``x-amz-security-token:…``, ``X-Amz-Security-Token=…``), as AWS quotes them back in
  signature errors.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import quote, unquote

__all__ = ["MASK", "redact", "redact_url", "secrets_in"]

MASK: Final = "***"

_SHORTEST: Final = 4
# Bounded: unbounded, a long word without "://" made every search quadratic.
_SCHEME: Final = r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]{0,31}://)"
# The user information runs from "scheme://" to the LAST "@" before the host, greedily: a
# password may hold "/", "?", "#" or "@" (that is how a URL ends up malformed and quoted in
# an error), and hiding too much beats showing a password.  It never crosses another
# "://": the "@" after a URL nested in a query belongs to that URL.
# - a URL on its own (redact_url's argument): up to the last "@" of the text;
_USERINFO_WHOLE: Final = re.compile(rf"\A(?P<lead>\s*){_SCHEME}(?P<userinfo>(?:(?!://).)*)@", re.S)
# - a URL quoted in a message: up to the last "@" before the closing quote;
_USERINFO_QUOTED: Final = re.compile(
    rf"(?P<lead>(?P<quote>['\"])){_SCHEME}(?P<userinfo>(?:(?!(?P=quote)|://)[^\n])*)@"
)
# - any other URL in a message: up to the last "@" before a space or a quote.
_USERINFO: Final = re.compile(rf"(?P<lead>){_SCHEME}(?P<userinfo>(?:(?!://)[^\s'\"<>])*)@")
# - a URL on its own whose scheme is mistyped (``postgres//u:PW@h``, ``redis:/u:PW@h``,
#   ``u:PW@h``): whatever follows the scheme-like start, up to the last "@".
_WELL_FORMED: Final = re.compile(rf"\A\s*{_SCHEME}")
_MISTYPED: Final = re.compile(
    r"\A(?P<lead>\s*(?:[A-Za-z][A-Za-z0-9+.-]{0,31}(?=[:/])(?!://))?:?/*)(?P<userinfo>.*)@", re.S
)
_SECRET_NAME: Final = (
    r"[A-Za-z0-9_.-]*(?:pass|pwd|secret|token|auth|credential|signature)[A-Za-z0-9_.-]*"
)
_SECRET_PARAM: Final = re.compile(rf"(?P<name>[?&;]{_SECRET_NAME}=)(?P<value>[^&;#\s'\"]*)", re.I)
# Anywhere, not only after "?" or "&": a header line, or a canonical query string's line.
_AWS_TOKEN: Final = re.compile(
    r"(?P<name>x-amz-security-token\s*[:=]\s*)(?P<value>[^\s&;,'\"]+)", re.I
)


def _mask_userinfo(match: re.Match[str]) -> str:
    user, colon, _password = match["userinfo"].partition(":")
    if not colon:
        return f"{match['lead']}{match['scheme']}{MASK}@"
    return f"{match['lead']}{match['scheme']}{user}:{MASK}@"


def _userinfo_secret(match: re.Match[str]) -> str:
    user, colon, password = match["userinfo"].partition(":")
    return password if colon else user


def _redact_text(text: str) -> str:
    text = _USERINFO_QUOTED.sub(_mask_userinfo, text)
    text = _USERINFO.sub(_mask_userinfo, text)
    text = _AWS_TOKEN.sub(lambda match: f"{match['name']}{MASK}", text)
    return _SECRET_PARAM.sub(lambda match: f"{match['name']}{MASK}", text)


def _mask_mistyped(match: re.Match[str]) -> str:
    user, colon, _password = match["userinfo"].partition(":")
    return f"{match['lead']}{user}:{MASK}@" if colon else f"{match['lead']}{MASK}@"


def redact_url(url: str) -> str:
    """``url`` with its password and secret query values replaced by ``***``.

    Safe on text that is not a valid URL: whatever looks like user information or a secret
    parameter is hidden, the rest (scheme, host, port, path) is kept so the message still
    says which URL is meant.  A mistyped scheme (``postgres//user:PW@host``) hides the same.
    """
    if _WELL_FORMED.match(url) is None:
        url = _MISTYPED.sub(_mask_mistyped, url, count=1)
    return _redact_text(_USERINFO_WHOLE.sub(_mask_userinfo, url, count=1))


def secrets_in(url: str) -> tuple[str, ...]:
    """The secrets :func:`redact_url` hides in ``url``, as written and percent-decoded.

    A library's error message may quote one of them without the URL around it (a decoded
    password, a bad parameter value): :func:`redact` removes those too.
    """
    found: list[str] = []
    # Decoded too: a URL nested in a parameter (``?endpoint=http%3A%2F%2Fuser%3Apw%40host``).
    whole = _USERINFO_WHOLE.match(url)
    if whole is None and _WELL_FORMED.match(url) is None:
        whole = _MISTYPED.match(url)
    if whole is not None:
        found.append(_userinfo_secret(whole))
    for text in (url, unquote(url)):
        for pattern in (_USERINFO_QUOTED, _USERINFO):
            found += [_userinfo_secret(match) for match in pattern.finditer(text)]
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
    return _redact_text(text)
