"""Secrets kept out of text: the credentials of every URL inside free text (error messages, git
output, settings shown to people) are hidden by one rule."""

from __future__ import annotations

import re

# `scheme://userinfo@`: the userinfo runs to the authority's last '@' (a password may hold an
# unescaped '@'), and never past '/', '?', '#' or whitespace, where the authority ends, nor
# past a character no URL holds (a quote, '<', '>'), where the text around a URL goes on.
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/?#\s\"<>`]*)@")
#: Schemes whose bare userinfo is a login name (the key stays in the SSH agent), not a secret.
_LOGIN_SCHEMES = frozenset({"ssh://", "git+ssh://", "ssh+git://"})
#: Passwords that only say "the secret is the user name" (GitHub's token-as-user forms).
_PLACEHOLDER_PASSWORDS = frozenset({"", "x-oauth-basic"})


def _hide_userinfo(match: re.Match[str]) -> str:
    scheme, userinfo = match["scheme"], match["userinfo"]
    user, colon, password = userinfo.partition(":")
    if not colon:
        if scheme.lower() in _LOGIN_SCHEMES:
            return match[0]
        return f"{scheme}***@"
    if password in _PLACEHOLDER_PASSWORDS:
        return f"{scheme}***@"
    return f"{scheme}{user}:***@"


def redact_text(text: str) -> str:
    """Hide the credentials of every URL with a scheme inside free text (error messages, git
    output, settings).

    The rule, for each `scheme://userinfo@host`:

    - `user:password@` keeps the user and hides the password: `postgresql://ops:***@db`,
      `https://x-access-token:***@github.com`, `redis://:***@cache`;
    - `token@` (a userinfo without ':') is a secret as a whole: `https://***@github.com/x`;
      so is `token:@` or `token:x-oauth-basic@`, where the password only says "the user is
      the token";
    - except that over `ssh://` (and `git+ssh://`, `ssh+git://`) a bare `git@` is a login name,
      kept as it is; the scp-like `git@host:path` has no scheme and is never touched.

    It over-hides rather than leaks: an '@' in a URL's query before any '/' counts as the
    end of a userinfo.
    """
    return _USERINFO.sub(_hide_userinfo, text)


def redact_url(url: str) -> str:
    """One URL with its credentials hidden, by `redact_text`'s rule:
    `https://ghp_x@github.com/o/r` -> `https://***@github.com/o/r`."""
    return redact_text(url)
