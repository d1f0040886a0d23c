"""structgen.frontends.json_schema.formats against independent oracles.

Oracles: ``jsonschema``'s draft 2020-12 ``FormatChecker`` (for the formats it checks
here: date, time, date-time, email, ipv4, ipv6, uuid), Python's ``datetime``,
``ipaddress`` and ``uuid``, and Python ``re`` transcriptions of the RFC ABNF for the
formats nothing here checks (duration, hostname, uri, uri-reference).
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structgen.frontends.json_schema.formats import FORMATS, format_expr
from structgen.grammar import ir

try:
    from structgen.grammar.compiler import compile_grammar
except ImportError:  # pragma: no cover - the compiler not built yet
    compile_grammar = None

CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

_ACCEPTORS: dict[str, object] = {}


def acceptor(name: str):
    """Full-match predicate for format ``name`` (compiled when the compiler exists)."""
    got = _ACCEPTORS.get(name)
    if got is None:
        expr = format_expr(name)
        assert expr is not None
        # a rule named after the format keeps compile caches keyed on repr() apart
        tag = "_f" + hashlib.sha256(name.encode()).hexdigest()[:12]
        g = ir.Grammar({"start": expr, tag: ir.EMPTY}, "start")
        if compile_grammar is not None:
            got = compile_grammar(g).accepts
        else:  # pragma: no cover
            got = lambda s, g=g: ir.reference_accepts(g, s)  # noqa: E731
        _ACCEPTORS[name] = got
    return got


def checker_ok(s: str, fmt: str) -> bool:
    return CHECKER.conforms(s, fmt)


def test_registry():
    assert FORMATS == {"date", "time", "date-time", "duration", "email", "hostname", "ipv4",
                       "ipv6", "uuid", "uri", "uri-reference", "idn-hostname", "idn-email"}
    assert format_expr("regex") is None
    assert format_expr("no-such-format") is None
    for name in FORMATS:
        e = format_expr(name)
        assert isinstance(e, ir.Expr)
        assert format_expr(name) is e  # cached


def test_languages_are_ascii_json_safe():
    """No quote, backslash, control or non-ASCII byte can appear in any format."""
    bad = [b for b in range(256) if b < 0x20 or b in (0x22, 0x5C) or b >= 0x7F]
    for name in sorted(FORMATS):
        acc = acceptor(name)
        for b in bad:
            ch = bytes([b]).decode("latin-1")
            for s in (ch, "a" + ch, "1.2.3.4" + ch, "http://a/" + ch):
                assert not acc(s.encode("latin-1")), (name, b)


# ---------------------------------------------------------------------------
# date, time, date-time
# ---------------------------------------------------------------------------

def date_oracle(s: str) -> bool:
    if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", s):
        return False
    try:
        datetime.date.fromisoformat(s)
    except ValueError:
        return False
    return True


def test_date_exhaustive_calendar():
    acc = acceptor("date")
    years = [0, 1, 4, 100, 400, 1600, 1700, 1800, 1900, 1996, 2000, 2023, 2024, 2100, 2400,
             8000, 9996, 9999]
    for y in years:
        for m in range(0, 14):
            for d in range(0, 33):
                s = f"{y:04d}-{m:02d}-{d:02d}"
                want = date_oracle(s)
                assert want == checker_ok(s, "date")
                assert acc(s) == want, s


def test_date_leap_rule_all_years():
    acc = acceptor("date")
    for y in range(1, 10000):
        s = f"{y:04d}-02-29"
        leap = y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)
        assert acc(s) == leap, s


@SETTINGS
@given(st.text(alphabet="0123456789-", min_size=8, max_size=11))
def test_date_random(s):
    assert acceptor("date")(s) == date_oracle(s) == checker_ok(s, "date")


two = st.one_of(st.integers(0, 23), st.integers(0, 99)).map(lambda v: f"{v:02d}")
frac = st.one_of(st.just(""), st.just("."),
                 st.text("0123456789", min_size=1, max_size=4).map(lambda t: "." + t))
offset = st.one_of(st.sampled_from(["Z", "z", "", "X", "+", "-00:00"]),
                   st.tuples(st.sampled_from("+-"), two, two).map(lambda t: f"{t[0]}{t[1]}:{t[2]}"))
time_st = st.tuples(two, two, two, frac, offset).map(lambda t: f"{t[0]}:{t[1]}:{t[2]}{t[3]}{t[4]}")


@SETTINGS
@given(time_st)
def test_time_matches_checker(s):
    assert acceptor("time")(s) == checker_ok(s, "time"), s


def test_time_cases():
    acc = acceptor("time")
    for s in ("00:00:00Z", "23:59:59.999999+14:00", "12:30:00z", "08:30:06.283185-08:00"):
        assert acc(s) and checker_ok(s, "time"), s
    # the leap second is RFC 3339 valid but jsonschema's checker rejects it: left out
    for s in ("23:59:60Z", "24:00:00Z", "12:60:00Z", "12:00:00", "12:00:00+0100", "1:00:00Z",
              "12:00:00.Z", "12:00:00+24:00", "12:00:00Z\n"):
        assert not acc(s), s


date_st = st.one_of(st.dates().map(datetime.date.isoformat),
                    st.text(alphabet="0123456789-", min_size=10, max_size=10))


@SETTINGS
@given(date_st, st.sampled_from("TTTt x"), time_st)
def test_date_time_matches_checker(d, sep, t):
    s = d + sep + t
    assert acceptor("date-time")(s) == checker_ok(s, "date-time"), s


def test_date_time_cases():
    acc = acceptor("date-time")
    for s in ("1963-06-19T08:30:06.283185Z", "2024-02-29t23:59:59-00:00"):
        assert acc(s) and checker_ok(s, "date-time")
    for s in ("2023-02-29T00:00:00Z", "1963-06-19 08:30:06Z", "0000-01-01T00:00:00Z",
              "1990-12-31T23:59:60Z"):
        assert not acc(s), s


# ---------------------------------------------------------------------------
# duration (RFC 3339 appendix A)
# ---------------------------------------------------------------------------

_N = "[0-9]+"
_DUR_TIME = rf"T(?:{_N}H(?:{_N}M(?:{_N}S)?)?|{_N}M(?:{_N}S)?|{_N}S)"
_DUR_DATE = rf"(?:{_N}D|{_N}M(?:{_N}D)?|{_N}Y(?:{_N}M(?:{_N}D)?)?)(?:{_DUR_TIME})?"
DURATION = re.compile(rf"P(?:{_DUR_DATE}|{_DUR_TIME}|{_N}W)")


duration_st = st.one_of(
    st.text(alphabet="PTYMWDHS0123", max_size=12),
    st.tuples(st.sampled_from(["P", "P", "p", ""]),
              st.lists(st.tuples(st.sampled_from(["1", "0", "25", ""]), st.sampled_from("YMWDTHS")),
                       max_size=5)).map(lambda t: t[0] + "".join(n + u for n, u in t[1])),
    st.tuples(st.lists(st.sampled_from(["1Y", "2M", "3D"]), max_size=3, unique=True),
              st.booleans(),
              st.lists(st.sampled_from(["4H", "5M", "6S"]), max_size=3, unique=True)).map(
        lambda t: "P" + "".join(sorted(t[0], key=lambda u: "YMD".index(u[-1]))) + ("T" if t[1] else "")
        + "".join(sorted(t[2], key=lambda u: "HMS".index(u[-1])))),
)


@SETTINGS
@given(duration_st)
def test_duration_random(s):
    assert acceptor("duration")(s) == bool(DURATION.fullmatch(s)), s


@pytest.mark.parametrize("s,want", [
    ("P4DT12H30M5S", True), ("P4Y", True), ("PT0S", True), ("P0D", True), ("P1M", True),
    ("PT1M", True), ("PT36H", True), ("P1W", True), ("P2W", True), ("P1Y2M", True),
    ("PT1D", False), ("P", False), ("P1YT", False), ("PT", False), ("P2D1Y", False),
    ("P1D2H", False), ("P2S", False), ("P1Y2W", False), ("P1", False), ("PT1.5S", False),
    ("p1d", False), ("P1Y1D", False),
])
def test_duration_cases(s, want):
    assert acceptor("duration")(s) == want


# ---------------------------------------------------------------------------
# ipv4, ipv6
# ---------------------------------------------------------------------------

def ip_oracle(s: str, cls) -> bool:
    if not s.isascii() or "%" in s:
        return False
    try:
        cls(s)
    except ValueError:
        return False
    return True


octet = st.one_of(st.integers(0, 300).map(str), st.integers(0, 99).map(lambda v: f"0{v}"),
                  st.sampled_from(["", "a", "-1", "1 "]))


@SETTINGS
@given(st.lists(octet, min_size=3, max_size=5).map(".".join))
def test_ipv4_random(s):
    want = ip_oracle(s, ipaddress.IPv4Address)
    assert want == checker_ok(s, "ipv4")
    assert acceptor("ipv4")(s) == want, s


def test_ipv4_all_octets():
    acc = acceptor("ipv4")
    for v in range(0, 1000):
        for t in (str(v), f"0{v}"):
            s = f"1.{t}.3.4"
            assert acc(s) == ip_oracle(s, ipaddress.IPv4Address), s


HEX = "0123456789abcdefABCDEF"


@st.composite
def ipv6_like(draw):
    """Mostly well-formed candidates (random group count, "::" placement, IPv4 tail),
    with occasional bad groups (empty, 5 digits, not hex) and stray colons."""
    r = draw(st.randoms(use_true_random=False))

    def group() -> str:
        if r.random() < 0.9:
            return "".join(r.choice(HEX) for _ in range(r.randint(1, 4)))
        return r.choice(["", "g", "00000", "fffff", "1:"])

    n = r.choice([r.randint(0, 9), r.randint(5, 8)])
    groups = [group() for _ in range(n)]
    if groups and r.random() < 0.3:
        groups[-1] = r.choice(["1.2.3.4", "255.255.255.255", "192.168.0.1", "01.2.3.4",
                               "1.2.3", "256.1.1.1"])
    s = ":".join(groups)
    if r.random() < (0.8 if n < 8 else 0.2):
        cut = r.randint(0, len(groups))
        s = ":".join(groups[:cut]) + "::" + ":".join(groups[cut:])
    if r.random() < 0.05:
        s = r.choice([":", ":::", "::"]) + s
    return s


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ipv6_like())
def test_ipv6_random(s):
    want = ip_oracle(s, ipaddress.IPv6Address)
    assert want == checker_ok(s, "ipv6")
    assert acceptor("ipv6")(s) == want, s


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**128 - 1), st.booleans())
def test_ipv6_canonical_forms(v, mapped):
    a = ipaddress.IPv6Address(v)
    acc = acceptor("ipv6")
    assert acc(str(a)) and acc(a.exploded)
    if mapped:
        assert acc("::ffff:" + str(ipaddress.IPv4Address(v % 2**32)))


def test_ipv6_cases():
    acc = acceptor("ipv6")
    for s in ("::", "::1", "1::", "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "1:2:3:4:5:6:1.2.3.4",
              "::ffff:192.168.0.1", "1:2:3:4:5::1.2.3.4", "FE80::0202:B3FF:FE1E:8329"):
        assert acc(s), s
    for s in ("", ":", ":::", "1:::2", "1::2::3", "12345::", "1:2:3:4:5:6:7:8:9",
              "1:2:3:4:5:6:7:1.2.3.4", "::01.2.3.4", "fe80::1%eth0", "[::1]", " ::1"):
        assert not acc(s), s


# ---------------------------------------------------------------------------
# uuid
# ---------------------------------------------------------------------------

@st.composite
def uuid_like(draw):
    chars = list(draw(st.text("0123456789abcdefABCDEF", min_size=32, max_size=32)))
    for pos in (8, 13, 18, 23):
        chars.insert(pos, "-")
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(chars) - 1))
        chars[i] = draw(st.sampled_from(["-", "g", "{", "", "00", "Z", " "]))
    return "".join(chars)


@SETTINGS
@given(uuid_like())
def test_uuid_random(s):
    if acceptor("uuid")(s):
        assert checker_ok(s, "uuid"), s  # never accept what the checker rejects
    # the checker (uuid.UUID + dash positions) also takes whitespace-padded hex through int(),
    # and uuid.UUID strips every hyphen, so extra hyphens elsewhere pass it too; RFC 4122's
    # string form (what the grammar accepts) is exactly 36 characters with four hyphens
    if " " not in s and len(s) == 36 and s.count("-") == 4:
        assert acceptor("uuid")(s) == checker_ok(s, "uuid"), s


def test_uuid_cases():
    acc = acceptor("uuid")
    assert acc("2EB8AA08-AA98-11EA-B4AA-73B441D16380")
    assert acc("2eb8aa08-aa98-11ea-b4aa-73b441d16380")
    assert not acc("2eb8aa08aa9811eab4aa73b441d16380")
    assert not acc("{2eb8aa08-aa98-11ea-b4aa-73b441d16380}")
    assert not acc("urn:uuid:2eb8aa08-aa98-11ea-b4aa-73b441d16380")


# ---------------------------------------------------------------------------
# hostname, email
# ---------------------------------------------------------------------------

# RFC 1123 labels; "--" in the 3rd and 4th positions (IDNA A-labels) is excluded on purpose
LABEL = r"(?![A-Za-z0-9-]{2}--)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME = re.compile(rf"{LABEL}(?:\.{LABEL})*")


def hostname_rfc(s: str) -> bool:
    """The RFC language (minus A-labels): labels of 1-63 bytes, at most 253 bytes in all."""
    return bool(HOSTNAME.fullmatch(s)) and len(s) <= 253


def hostname_documented(s: str) -> bool:
    """The documented narrowing: a label starting at byte offset o has at most 63 - o % 32
    bytes (so the first label, and one at a multiple of 32, may have all 63)."""
    if not hostname_rfc(s):
        return False
    o = 0
    for label in s.split("."):
        if len(label) > 63 - o % 32:
            return False
        o += len(label) + 1
    return True


@SETTINGS
@given(st.lists(st.text("ab0Z-_.", max_size=6), min_size=1, max_size=4).map(".".join))
def test_hostname_random(s):
    assert acceptor("hostname")(s) == bool(HOSTNAME.fullmatch(s)), s


label_st = st.one_of(st.integers(1, 5), st.integers(28, 66)).flatmap(
    lambda n: st.text("ab0-", min_size=n, max_size=n))


@SETTINGS
@given(st.lists(label_st, min_size=1, max_size=9).map(".".join))
def test_hostname_long_names(s):
    acc = acceptor("hostname")(s)
    assert acc == hostname_documented(s), s
    # soundness against the RFC itself, and completeness for labels up to 32 bytes
    assert not acc or hostname_rfc(s)
    if hostname_rfc(s) and all(len(x) <= 32 for x in s.split(".")):
        assert acc, s


def test_hostname_lengths():
    acc = acceptor("hostname")
    assert acc("a" * 63) and not acc("a" * 64)
    assert acc("a" * 63 + "." + "b" * 63) and not acc("a" * 63 + "." + "b" * 64)
    assert acc("a-" * 31 + "a") and not acc("-a") and not acc("a-") and not acc("a..b")
    assert not acc("") and not acc(".") and not acc("example.com.") and not acc("a_b")
    assert not acc("xn--4gbwdl.xn--wgbh1c")  # A-labels are rejected (punycode not checkable)
    assert acc("1host") and acc("www.example.com")
    # total length: at most 253 bytes (the JSON-Schema-Test-Suite's 259-byte name is invalid)
    name253 = ".".join(["a" * 63] * 3 + ["b" * 61])
    assert len(name253) == 253 and acc(name253) and not acc(name253 + "b")
    assert not acc(".".join(["a" * 63] * 4) + ".com")
    many = ".".join("abcdefghij"[i % 10] for i in range(127))  # 127 one-byte labels
    assert len(many) == 253 and acc(many) and not acc(many + ".a")
    # the narrowing: a label starting at offset 4 may have 59 bytes, not 63
    assert acc("www." + "c" * 59) and not acc("www." + "c" * 60)
    assert acc("a" * 31 + "." + "c" * 63)  # a label starting at offset 32 may use all 63


ATEXT = "A-Za-z0-9!#$%&'*+\\-/=?^_`{|}~"
LOCAL = re.compile(rf"[{ATEXT}]+(?:\.[{ATEXT}]+)*")


# email domains: RFC 5321 LDH labels, "--" anywhere inside (A-labels) allowed
LDH_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
LDH_HOSTNAME = re.compile(rf"{LDH_LABEL}(?:\.{LDH_LABEL})*")


def ldh_documented(s: str) -> bool:
    """hostname_documented with LDH labels (A-labels and other R-LDH labels allowed)."""
    if not (LDH_HOSTNAME.fullmatch(s) and len(s) <= 253):
        return False
    o = 0
    for label in s.split("."):
        if len(label) > 63 - o % 32:
            return False
        o += len(label) + 1
    return True


def email_oracle(s: str) -> bool:
    local, at, domain = s.rpartition("@")
    if not at or not LOCAL.fullmatch(local) or len(local) > 64:
        return False
    if domain.startswith("[IPv6:") and domain.endswith("]"):
        return ip_oracle(domain[6:-1], ipaddress.IPv6Address)
    if domain.startswith("[") and domain.endswith("]"):
        return ip_oracle(domain[1:-1], ipaddress.IPv4Address)
    return ldh_documented(domain)


email_st = st.tuples(
    st.one_of(st.text("ab.~+'\"@ ", min_size=0, max_size=8),
              st.lists(st.text("ab~+'{", min_size=1, max_size=4), min_size=1, max_size=3).map(".".join)),
    st.sampled_from(["@", "@", "@", "@@", ""]),
    st.one_of(st.text("ab.-", max_size=8),
              st.lists(st.text("ab-0", min_size=1, max_size=4), min_size=1, max_size=3).map(".".join),
              st.sampled_from(["xn--j1aef", "b.xn--j1aef", "xn--bcher-kva.example", "ab--c.d"]),
              st.sampled_from(["[127.0.0.1]", "[IPv6:::1]", "[300.0.0.1]", "[::1]",
                               "[IPv6:::12345]", "[IPv6:1:2:3:4:5:6:7:8]"])),
).map("".join)


@SETTINGS
@given(email_st)
def test_email_random(s):
    got = acceptor("email")(s)
    assert got == email_oracle(s), s
    if got:
        assert checker_ok(s, "email")


def test_email_cases():
    acc = acceptor("email")
    for s in ("joe.bloggs@example.com", "te~st@example.com", "~test@example.com",
              "test~@example.com", "te.s.t@example.com", "joe.bloggs@[127.0.0.1]",
              "joe.bloggs@[IPv6:::1]", "a" * 64 + "@x.org"):
        assert acc(s), s
    for s in ("2962", ".test@example.com", "test.@example.com", "te..st@example.com",
              "joe.bloggs@[127.0.0.300]", "joe.bloggs@[IPv6:::12345]", "a" * 65 + "@x.org",
              '"joe bloggs"@example.com', "joe@-example.com", "@example.com", "joe@"):
        assert not acc(s), s


# ---------------------------------------------------------------------------
# uri, uri-reference (RFC 3986)
# ---------------------------------------------------------------------------

_UNRES = r"A-Za-z0-9\-._~"
_SUB = r"!$&'()*+,;="
_PCT = r"%[0-9A-Fa-f]{2}"
_PCHAR = rf"(?:[{_UNRES}{_SUB}:@]|{_PCT})"
_SEGS = rf"(?:/{_PCHAR}*)*"
_QF = rf"(?:{_PCHAR}|[/?])*"
_AUTH = (rf"(?:(?:[{_UNRES}{_SUB}:]|{_PCT})*@)?"
         rf"(?:\[(?P<ip>[^\]]*)\]|(?:[{_UNRES}{_SUB}]|{_PCT})*)(?::[0-9]*)?")
_TAIL = rf"(?:\?{_QF})?(?:#{_QF})?"
URI = re.compile(rf"[A-Za-z][A-Za-z0-9+\-.]*:"
                 rf"(?://{_AUTH}{_SEGS}|/(?:{_PCHAR}+{_SEGS})?|{_PCHAR}+{_SEGS}|){_TAIL}")
RELATIVE_REF = re.compile(rf"(?://{_AUTH}{_SEGS}|/(?:{_PCHAR}+{_SEGS})?"
                          rf"|(?:[{_UNRES}{_SUB}@]|{_PCT})+{_SEGS}|){_TAIL}")
IPVFUTURE = re.compile(rf"v[0-9A-Fa-f]+\.[{_UNRES}{_SUB}:]+")


def _ip_literal_ok(m: re.Match) -> bool:
    ip = m.group("ip")
    return ip is None or bool(IPVFUTURE.fullmatch(ip)) or ip_oracle(ip, ipaddress.IPv6Address)


def uri_oracle(s: str) -> bool:
    m = URI.fullmatch(s)
    return bool(m) and _ip_literal_ok(m)


def uri_reference_oracle(s: str) -> bool:
    if uri_oracle(s):
        return True
    m = RELATIVE_REF.fullmatch(s)
    return bool(m) and _ip_literal_ok(m)


uri_st = st.one_of(
    st.text(alphabet="ab1:/?#[]@!$&'()*+,;=-._~%F \"<\\{", max_size=14),
    st.tuples(st.sampled_from(["http://", "a:", "//", "/", "", "x+y.z:", "1a:", "urn:"]),
              st.text(alphabet="ab1:/?#@%F.[]v", max_size=10),
              st.sampled_from(["", "[::1]", "[v1.x]", "[1.2.3.4]", ":80", "%41", "%4", "%zz"]),
              st.text(alphabet="ab/?#", max_size=4)).map("".join),
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(uri_st)
def test_uri_random(s):
    assert acceptor("uri")(s) == uri_oracle(s), s
    assert acceptor("uri-reference")(s) == uri_reference_oracle(s), s


URI_VALID = ["http://foo.bar/?baz=qux#quux", "http://foo.com/blah_(wikipedia)_blah#cite-1",
             "http://foo.bar/?q=Test%20URL-encoded%20stuff", "http://xn--nw2a.xn--j6w193g/",
             "http://-.~_!$&'()*+,;=:%40:80%2f::::::@example.com", "http://223.255.255.254",
             "ftp://ftp.is.co.za/rfc/rfc1808.txt", "http://www.ietf.org/rfc/rfc2396.txt",
             "ldap://[2001:db8::7]/c=GB?objectClass?one", "mailto:John.Doe@example.com",
             "news:comp.infosystems.www.servers.unix", "tel:+1-816-555-1212",
             "urn:oasis:names:specification:docbook:dtd:xml:4.1.2", "http://[v1.fe]:8/"]
URI_INVALID = ["//foo.bar/?baz=qux#quux", "/abc", "\\\\WINDOWS\\fileshare", "abc",
               "http:// shouldfail.com", ":// should fail", "bar,baz:foo", "http://[::1/",
               "http://a/%zz", "http://[1.2.3.4]/"]


def test_uri_cases():
    acc = acceptor("uri")
    for s in URI_VALID:
        assert acc(s) and uri_oracle(s), s
    for s in URI_INVALID:
        assert not acc(s) and not uri_oracle(s), s


def test_uri_reference_cases():
    acc = acceptor("uri-reference")
    for s in URI_VALID + ["//foo.bar/?baz=qux#quux", "/abc", "abc", "#fragment", "?q", "",
                          "../x/y", "a/b:c"]:
        assert acc(s), s
    for s in ("\\\\WINDOWS\\fileshare", "#frag\\ment", "a:b:c#%", "1a:b/c d", "a b"):
        assert not acc(s), s
    # a first segment with ':' must be a scheme: "1a:b" is neither URI nor relative
    assert not acc("1a:b")


# ---------------------------------------------------------------------------
# length bounds of format languages (used to drop redundant minLength/maxLength)
# ---------------------------------------------------------------------------

def _ir_exprs():
    leaf = st.sampled_from([ir.lit("a"), ir.lit("b"), ir.byteset(b"ab"), ir.EMPTY])
    return st.recursive(leaf, lambda kids: st.one_of(
        st.lists(kids, min_size=1, max_size=3).map(lambda xs: ir.seq(*xs)),
        st.lists(kids, min_size=1, max_size=3).map(lambda xs: ir.alt(*xs)),
        st.tuples(kids, st.integers(0, 2), st.integers(0, 2)).map(
            lambda t: ir.rep(t[0], t[1], t[1] + t[2]))), max_leaves=5)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(_ir_exprs())
def test_length_bounds_match_brute_force(e):
    from itertools import product

    from hypothesis import assume

    from structgen.frontends.json_schema.formats import length_bounds

    b = length_bounds(e)
    assert b is not None and b[1] is not None  # every generated expression is finite
    assume(b[1] <= 5)
    g = ir.Grammar({"s": e}, "s")
    accepts = compile_grammar(g).accepts if compile_grammar is not None else (
        lambda w: ir.reference_accepts(g, w))
    lengths = [n for n in range(0, 7) for w in product("ab", repeat=n) if accepts("".join(w))]
    assert (b[0], b[1]) == (min(lengths), max(lengths))


def test_format_length_bounds_and_implied_max_length():
    from structgen.frontends.json_schema.formats import format_length_bounds
    from structgen.json_schema import compile_json_schema

    assert format_length_bounds("uuid") == (36, 36) and format_length_bounds("ipv4") == (7, 15)
    assert format_length_bounds("hostname") == (1, 253)
    assert format_length_bounds("email") == (3, 64 + 1 + 253)
    assert format_length_bounds("date-time")[1] is None
    longest = "x" * 64 + "@" + ".".join(["a" * 63] * 3 + ["b" * 61])
    # maxLength above the format's longest string is implied: same language either way
    g = compile_json_schema({"type": "string", "format": "email", "maxLength": 1024})
    assert g.accepts(f'"{longest}"') and g.accepts('"a@b"') and not g.accepts('"ab"')
    assert not g.accepts(f'"{longest}b"')
    # a binding maxLength / minLength is still enforced (checked by jsonschema too)
    ipv4_14 = {"type": "string", "format": "ipv4", "maxLength": 14}
    email_5 = {"type": "string", "format": "email", "minLength": 5}
    for schema, text, ok in ((ipv4_14, "255.255.255.255", False), (ipv4_14, "255.255.255.25", True),
                             (email_5, "a@b", False), (email_5, "ab@cd", True)):
        assert jsonschema.Draft202012Validator(schema, format_checker=CHECKER).is_valid(text) == ok
        assert compile_json_schema(schema).accepts(f'"{text}"') == ok, (schema, text)


@pytest.mark.parametrize("draft, fmt, enforced", [
    ("http://json-schema.org/draft-06/schema#", "uuid", False),   # uuid is defined from 2019-09 on
    ("http://json-schema.org/draft-07/schema#", "duration", False),
    ("http://json-schema.org/draft-04/schema#", "date", False),   # date is defined from draft 7 on
    ("http://json-schema.org/draft-07/schema#", "date", True),
    ("http://json-schema.org/draft-06/schema#", "ipv4", True),
    ("https://json-schema.org/draft/2020-12/schema", "uuid", True),
])
def test_formats_follow_the_schema_draft(draft: str, fmt: str, enforced: bool) -> None:
    """A format name the schema's own draft does not define is an unknown format there (an
    annotation, as the draft's validators treat it); the oracle is jsonschema's validator for
    that draft with its format checker."""
    import jsonschema

    schema = {"$schema": draft, "type": "string", "format": fmt}
    cls = jsonschema.validators.validator_for(schema)
    valid = cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid("")
    assert valid == (not enforced)
    from structgen.json_schema import compile_json_schema

    e = compile_json_schema(schema).engine
    c = e.walk(e.start, b'""')
    accepted = c >= 0 and e.is_accepting(c)
    assert accepted == (not enforced)
