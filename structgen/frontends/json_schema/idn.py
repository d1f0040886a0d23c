"""Value checks for internationalised names: ``hostname`` A-labels, ``idn-hostname``, ``idn-email``.

These formats are checked per value, not by an automaton (see
:mod:`structgen.grammar.checks`): whether ``xn--...`` is a valid A-label depends on the
Punycode arithmetic over the whole label and on IDNA2008's code point, contextual and
bidi rules. The ``idna`` package (IDNA2008, RFC 5891-5893) decides; the predicates here
add what it leaves out:

* :func:`hostname_ok` (draft-07 and later ``hostname``; the automaton has already checked
  the LDH syntax and lengths): every label with ``--`` in its 3rd and 4th positions must be
  a valid A-label (RFC 5890 section 2.3.1, RFC 5891 section 4.2.3.1), checked as
  :func:`idn_hostname_ok` checks the whole name.
* :func:`idn_hostname_ok`: RFC 5890/5891 through ``idna.encode`` (U-labels and A-labels,
  the label separators U+002E, U+3002, U+FF0E, U+FF61), plus: no trailing separator (the
  JSON-Schema-Test-Suite reads a trailing dot as invalid; ``idna`` strips it), at most 253
  bytes in A-label form, and the RFC 5893 rule that in a bidi domain name (one with an
  RTL label) every label satisfies the Bidi Rule.
* :func:`idn_email_ok`: RFC 6531 ``Mailbox``: a local part of at most 64 bytes, either a
  dot-atom whose atoms are ASCII ``atext`` or non-ASCII characters, or a quoted string
  (printable ASCII but ``"`` and ``\\``, non-ASCII characters, quoted pairs), ``@``, and a
  domain that is a valid ``idn-hostname`` once NFC-normalised (RFC 6531 leaves
  normalisation to the sender), or an ``[IPv4]`` / ``[IPv6:...]`` address literal.

Importing this module registers the predicates under their marker bytes.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata

import idna

from structgen.grammar.checks import register_value_check

__all__ = ["HOSTNAME_CHECK", "IDN_EMAIL_CHECK", "IDN_HOSTNAME_CHECK", "hostname_ok", "idn_email_ok",
           "idn_hostname_ok"]

#: Marker byte of the draft-07+ ``hostname`` A-label check.
HOSTNAME_CHECK = 0xF8
#: Marker byte of the ``idn-hostname`` check.
IDN_HOSTNAME_CHECK = 0xF9
#: Marker byte of the ``idn-email`` check.
IDN_EMAIL_CHECK = 0xFA

_SEPARATORS = ".\u3002\uff0e\uff61"
_ATEXT = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-/=?^_`{|}~")
_RTL = frozenset(("R", "AL", "AN"))
# RFC 5321 Quoted-string with RFC 6531's UTF8-non-ascii in qtextSMTP
_QUOTED = re.compile(r'"(?:[\x20\x21\x23-\x5b\x5d-\x7e\x80-\U0010ffff]|\\[\x20-\x7e])*"')


def _is_rldh(label: str) -> bool:
    return len(label) >= 4 and label[2:4] == "--"


def hostname_ok(value: str) -> bool:
    """A draft-07+ ``hostname`` whose LDH syntax is already checked: are its R-LDH labels
    (``--`` in positions 3-4) valid A-labels?"""
    if not any(_is_rldh(label) for label in value.split(".")):
        return True
    return idn_hostname_ok(value)


def idn_hostname_ok(value: str) -> bool:
    """Is ``value`` a valid internationalised hostname (RFC 5890-5893, see the module)?"""
    if not value or value[-1] in _SEPARATORS:
        return False
    try:
        encoded = idna.encode(value)
        if len(encoded) > 253:
            return False
        labels = idna.decode(encoded).split(".")
        if any(unicodedata.bidirectional(c) in _RTL for label in labels for c in label):
            for label in labels:
                idna.check_bidi(label, check_ltr=True)
    except (idna.IDNAError, UnicodeError, ValueError):
        return False
    return True


def _address_literal(domain: str) -> bool:
    inner = domain[1:-1]
    if not domain.endswith("]"):
        return False
    try:
        if inner[:5].lower() == "ipv6:":
            return "%" not in inner and bool(ipaddress.IPv6Address(inner[5:]))
        return bool(ipaddress.IPv4Address(inner))
    except ValueError:
        return False


def idn_email_ok(value: str) -> bool:
    """Is ``value`` a valid internationalised email address (RFC 6531, see the module)?"""
    local, at, domain = value.rpartition("@")
    if not at or not local or not domain:
        return False
    if len(local.encode("utf-8")) > 64:
        return False
    if local.startswith('"'):
        if not _QUOTED.fullmatch(local):
            return False
    elif any(not atom or any(c not in _ATEXT and ord(c) < 0x80 for c in atom) for atom in local.split(".")):
        return False
    if domain.startswith("["):
        return _address_literal(domain)
    return idn_hostname_ok(unicodedata.normalize("NFC", domain))


register_value_check(HOSTNAME_CHECK, "hostname (A-labels)", hostname_ok)
register_value_check(IDN_HOSTNAME_CHECK, "idn-hostname", idn_hostname_ok)
register_value_check(IDN_EMAIL_CHECK, "idn-email", idn_email_ok)
