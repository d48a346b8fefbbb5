"""``format`` values as IR over the inside of a JSON string, each a subset of its RFC syntax.

Every format is written as an ECMA regular expression and compiled with the JSON character
encoder (a ``\\u0041`` spelling of ``A`` is still an ``A``). Each pattern is at least as strict
as the RFC and as the reference validators: when unsure we admit less, since a generated value
must always validate. Dates check days per month, leap years included.
"""

from __future__ import annotations

from functools import cache

from constrain.grammars.ir import Node, alt, intersect, repeat
from constrain.grammars.json_schema.json_strings import ANY_JSON_CHAR

__all__ = ["KNOWN_FORMATS", "format_ir"]

_LEAP_YEAR = r"(?:\d\d(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)"
_DATE = (
    r"(?:\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
    r"|02-(?:0[1-9]|1\d|2[0-8]))|" + _LEAP_YEAR + r"-02-29)"
)
_OFFSET = r"(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?" + _OFFSET
_DUR_TIME = r"T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)"
_DURATION = (
    r"P(?:(?:\d+Y(?:\d+M(?:\d+D)?)?|\d+M(?:\d+D)?|\d+D)(?:" + _DUR_TIME + r")?|" + _DUR_TIME + r"|\d+W)"
)
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = _LABEL + r"(?:\." + _LABEL + r")*"
# IDNA 2008 (RFC 5890-5893), as the `idna` package checks it. A label with "--" in positions 3-4
# is an A-label whose punycode a pattern cannot check, so none is admitted: ASCII labels are
# NR-LDH labels, and U-labels (at most two, of at most 6 characters, in a name of at most
# _IDN_U_MAX_LENGTH) use only lowercase letters that are PVALID with no contextual or bidi rule
# (Latin-1 letters, CJK ideographs). Each such U-label encodes to at most 40 characters, so the
# encoded name stays within the 253 that DNS allows.


def _nr_ldh_label(char: str, max_length: int) -> str:
    """A label of ``char``s and inner hyphens, never "--" at positions 3-4."""
    c, h = char, char[:-1] + "-]"
    return (f"{c}(?:{c}|{h}{c}|{h}{h}{c}|{h}(?:{c}{h}|-{c}){h}{{0,{max_length - 5}}}{c})?")


_IDN_ASCII_LABEL = _nr_ldh_label("[A-Za-z0-9]", 63)
_IDN_U_LABEL = _nr_ldh_label("[a-z0-9\u00df-\u00f6\u00f8-\u00ff\u4e00-\u9fff]", 6)
_IDN_ASCII_HOSTNAME = _IDN_ASCII_LABEL + r"(?:\." + _IDN_ASCII_LABEL + r")*"
_IDN_U_HOSTNAME = (r"(?:" + _IDN_ASCII_LABEL + r"\.)*" + _IDN_U_LABEL + r"(?:\." + _IDN_ASCII_LABEL + r")*(?:\."
                   + _IDN_U_LABEL + r"(?:\." + _IDN_ASCII_LABEL + r")*)?")
_IDN_U_MAX_LENGTH = 150
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]\d|\d)"
_IPV4 = _OCTET + r"(?:\." + _OCTET + r"){3}"
_H16 = r"[0-9A-Fa-f]{1,4}"
_LS32 = r"(?:" + _H16 + ":" + _H16 + "|" + _IPV4 + ")"
_IPV6 = "(?:" + "|".join([
    r"(?:" + _H16 + r":){6}" + _LS32,
    r"::(?:" + _H16 + r":){5}" + _LS32,
    r"(?:" + _H16 + r")?::(?:" + _H16 + r":){4}" + _LS32,
    r"(?:(?:" + _H16 + r":){0,1}" + _H16 + r")?::(?:" + _H16 + r":){3}" + _LS32,
    r"(?:(?:" + _H16 + r":){0,2}" + _H16 + r")?::(?:" + _H16 + r":){2}" + _LS32,
    r"(?:(?:" + _H16 + r":){0,3}" + _H16 + r")?::" + _H16 + ":" + _LS32,
    r"(?:(?:" + _H16 + r":){0,4}" + _H16 + r")?::" + _LS32,
    r"(?:(?:" + _H16 + r":){0,5}" + _H16 + r")?::" + _H16,
    r"(?:(?:" + _H16 + r":){0,6}" + _H16 + r")?::",
]) + ")"
_EMAIL_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_EMAIL = _EMAIL_ATOM + r"(?:\." + _EMAIL_ATOM + r")*@" + _HOSTNAME
_HEX = r"[0-9A-Fa-f]"
_UUID = _HEX + "{8}-" + _HEX + "{4}-" + _HEX + "{4}-" + _HEX + "{4}-" + _HEX + "{12}"
# RFC 3986, without IP-literal hosts (no brackets): a strict subset.
_PCT = r"%[0-9A-Fa-f]{2}"
_UNRESERVED_SUB = r"[A-Za-z0-9\-._~!$&'()*+,;=]"
_PCHAR = r"(?:" + _UNRESERVED_SUB + r"|" + _PCT + r"|[:@])"
_SEGMENT = _PCHAR + "*"
_SEGMENT_NZ = _PCHAR + "+"
_SEGMENT_NZ_NC = r"(?:" + _UNRESERVED_SUB + r"|" + _PCT + r"|@)+"
_AUTHORITY = (
    r"(?:(?:" + _UNRESERVED_SUB + r"|" + _PCT + r"|:)*@)?(?:" + _UNRESERVED_SUB + r"|" + _PCT + r")*(?::\d*)?"
)
_PATH_ABEMPTY = r"(?:/" + _SEGMENT + r")*"
_HIER = (
    r"(?://" + _AUTHORITY + _PATH_ABEMPTY + r"|/(?:" + _SEGMENT_NZ + _PATH_ABEMPTY + r")?|"
    + _SEGMENT_NZ + _PATH_ABEMPTY + r"|)"
)
_RELATIVE = (
    r"(?://" + _AUTHORITY + _PATH_ABEMPTY + r"|/(?:" + _SEGMENT_NZ + _PATH_ABEMPTY + r")?|"
    + _SEGMENT_NZ_NC + _PATH_ABEMPTY + r"|)"
)
_QUERY_FRAGMENT = r"(?:\?(?:" + _PCHAR + r"|[/?])*)?(?:#(?:" + _PCHAR + r"|[/?])*)?"
_URI = r"[A-Za-z][A-Za-z0-9+.\-]*:" + _HIER + _QUERY_FRAGMENT
_URI_REFERENCE = r"(?:" + _URI + r"|" + _RELATIVE + _QUERY_FRAGMENT + r")"
_JSON_POINTER = r"(?:/(?:[^~/]|~[01])*)*"
# RFC 6570 level 4, ASCII literals only (a subset: no ucschar/iprivate).
_UT_LITERAL = r"(?:[!#$&(-;=?-\[\]_a-z~]|" + _PCT + r")"
_UT_VARCHAR = r"(?:[A-Za-z0-9_]|" + _PCT + r")"
_UT_VARSPEC = _UT_VARCHAR + r"(?:\.?" + _UT_VARCHAR + r")*(?::[1-9]\d{0,3}|\*)?"
_URI_TEMPLATE = r"(?:" + _UT_LITERAL + r"|\{[+#./;?&=,!@|]?" + _UT_VARSPEC + r"(?:," + _UT_VARSPEC + r")*\})*"
# Regular expressions that both Python's re and ECMA-262 (u mode) compile: literal characters,
# escapes, '.', simple classes, quantifiers, alternation, groups nested up to two deep, anchors at
# the edges of top-level alternatives. A strict subset of the valid ones (class ranges only such as
# 0-9, a-z, A-F; no lookaround or backreferences), which is all soundness needs.
_RE_ESCAPE = r"\\[\\^$.|?*+()\[\]{}/dDwWsS]"
_RE_CLASS = r"\[\^?(?:[^\\\]\[\-^|&~]|[0-9]-9|a-[zf]|A-[ZF]|\\[\\^$.|?*+()\[\]{}/\-dDwWsS])+\]"
_RE_QUANT = r"(?:[*+?]|\{\d{1,4}\}|\{\d{1,4},\})"


def _re_level(atom: str) -> str:
    """A quantified group whose alternatives are sequences of quantified ``atom``s."""
    piece = atom + _RE_QUANT + "?"
    return r"\((?:\?:)?(?:" + piece + r")*(?:\|(?:" + piece + r")*)*\)" + _RE_QUANT + "?"


_RE_ATOM0 = r"(?:[^\\^$.|?*+()\[\]{}]|" + _RE_ESCAPE + r"|\.|" + _RE_CLASS + r")"
_RE_ATOM1 = r"(?:" + _RE_ATOM0 + "|" + _re_level(_RE_ATOM0)[:-len(_RE_QUANT) - 1] + ")"
_RE_ATOM2 = r"(?:" + _RE_ATOM1 + "|" + _re_level(_RE_ATOM1)[:-len(_RE_QUANT) - 1] + ")"
_RE_BRANCH = r"\^?(?:" + _RE_ATOM2 + _RE_QUANT + r"?)*\$?"
_REGEX = _RE_BRANCH + r"(?:\|" + _RE_BRANCH + r")*"

_PATTERNS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": _DATE + "T" + _TIME,
    "duration": _DURATION,
    "email": _EMAIL,
    "idn-email": _EMAIL,
    "hostname": _HOSTNAME,
    "idn-hostname": _IDN_ASCII_HOSTNAME,
    "idn-hostname@u-labels": _IDN_U_HOSTNAME,
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "uuid": _UUID,
    "uri": _URI,
    "iri": _URI,
    "uri-reference": _URI_REFERENCE,
    "iri-reference": _URI_REFERENCE,
    "json-pointer": _JSON_POINTER,
    "relative-json-pointer": r"(?:0|[1-9]\d*)(?:#|" + _JSON_POINTER + ")",
    "uri-template": _URI_TEMPLATE,
    "regex": _REGEX,
    # draft-03 names
    "ip-address": _IPV4,
    "host-name": _HOSTNAME,
    "time@draft3": r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d",  # draft-03 time: hh:mm:ss
}
# Total length limits the RFCs set on top of the syntax.
_MAX_LENGTH = {"hostname": 253, "idn-hostname": 253, "host-name": 253, "idn-hostname@u-labels": _IDN_U_MAX_LENGTH}
# Formats that are the union of several patterns (each with its own length limit).
_ALSO = {"idn-hostname": "idn-hostname@u-labels"}

KNOWN_FORMATS = frozenset(k for k in _PATTERNS if "@" not in k)


@cache
def format_ir(name: str) -> Node:
    """The inside of a JSON string holding a valid ``name`` (one of ``KNOWN_FORMATS``)."""
    from constrain.grammars.json_schema.json_strings import json_char
    from constrain.grammars.regex import regex_to_ir

    node = regex_to_ir(_PATTERNS[name], dialect="ecma", search=False, encode_class=json_char)
    if name in _MAX_LENGTH:
        node = intersect(node, repeat(ANY_JSON_CHAR, 1, _MAX_LENGTH[name]))
    return alt(node, format_ir(_ALSO[name])) if name in _ALSO else node
