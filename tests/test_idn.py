"""Hostname and email labels per draft, A-labels included (structgen.frontends.json_schema.formats).

Oracles: the JSON-Schema-Test-Suite's optional format files (draft-07 and 2020-12), the
``idna`` package (IDNA2008) and Python's own ``encodings.idna`` codec for A-labels, and
``jsonschema``'s format checker. The documented choices
(structgen/frontends/json_schema/formats.py, docs/formats.md):

* ``email``, every draft: RFC 5321 LDH domain labels, A-labels accepted unchecked;
* ``hostname``, draft-04/06: LDH labels, A-labels accepted unchecked;
* ``hostname``, draft-07 and later: R-LDH labels (``--`` in positions 3-4) rejected, valid
  A-labels included, since their validity is beyond an automaton: never a false positive;
* ``idn-hostname`` / ``idn-email``: unsupported (a typed error), never silently unchecked.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import idna
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structgen import compile_json_schema
from structgen.errors import StructgenError

ROOT = Path(__file__).resolve().parent.parent
SUITES = [ROOT / "tests" / "data" / "json-schema-test-suite" / "tests",
          ROOT.parent / "shared" / "data" / "json-schema-test-suite" / "tests",
          Path("/work/shared/data/json-schema-test-suite/tests")]
DRAFT_URI = {"4": "http://json-schema.org/draft-04/schema#",
             "6": "http://json-schema.org/draft-06/schema#",
             "7": "http://json-schema.org/draft-07/schema#",
             "2020-12": "https://json-schema.org/draft/2020-12/schema"}

_GRAMMARS: dict[tuple[str, str], object] = {}


def grammar(fmt: str, draft: str):
    key = (fmt, draft)
    if key not in _GRAMMARS:
        _GRAMMARS[key] = compile_json_schema({"$schema": DRAFT_URI[draft], "type": "string",
                                              "format": fmt})
    return _GRAMMARS[key]


def accepts(fmt: str, draft: str, value: str) -> bool:
    return grammar(fmt, draft).accepts(json.dumps(value, ensure_ascii=False))


def is_rldh(label: str) -> bool:
    return len(label) >= 4 and label[2:4] == "--"


# ---------------------------------------------------------------------------
# the reported cases
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("draft", ["4", "6", "7", "2020-12"])
def test_email_accepts_a_labels(draft):
    for s in ["a@b.xn--j1aef", "user@xn--bcher-kva.example", "x@a--b.example",
              "joe@xn--9n2bp8q.xn--9t4b11yi5a"]:
        assert accepts("email", draft, s), s
    for s in ["a@-b.example", "a@b-.example", "a@.example", "a@b..c", "a@xn--"[:-1] + "-"]:
        assert not accepts("email", draft, s), s


def test_hostname_labels_per_draft():
    for draft in ("4", "6"):
        for s in ["xn--bcher-kva.example", "xn--j1aef", "a--b.com", "ab--c.com"]:
            assert accepts("hostname", draft, s), (draft, s)
    for draft in ("7", "2020-12"):
        assert accepts("hostname", draft, "a--b.com")
        for s in ["xn--bcher-kva.example", "xn--X", "ab--c.com", "XN--aa---o47jg78q"]:
            assert not accepts("hostname", draft, s), (draft, s)
    for draft in DRAFT_URI:
        for s in ["-a.com", "a-.com", "a..b", "a_b.com", "example.com.", "a" * 64]:
            assert not accepts("hostname", draft, s), (draft, s)


@pytest.mark.parametrize("fmt", ["idn-hostname", "idn-email"])
def test_idn_formats_are_unsupported_not_unchecked(fmt):
    with pytest.raises(StructgenError, match=fmt):
        compile_json_schema({"type": "string", "format": fmt})


# ---------------------------------------------------------------------------
# the JSON-Schema-Test-Suite's optional format files
# ---------------------------------------------------------------------------

def suite_cases(draft_dir: str, fmt: str) -> list[tuple[str, bool, str]]:
    for base in SUITES:
        f = base / draft_dir / "optional" / "format" / f"{fmt}.json"
        if f.exists():
            groups = json.loads(f.read_text(encoding="utf-8"))
            return [(t["data"], t["valid"], t["description"]) for g in groups for t in g["tests"]
                    if isinstance(t["data"], str)]
    return []


@pytest.mark.parametrize("draft,draft_dir", [("7", "draft7"), ("2020-12", "draft2020-12")])
@pytest.mark.parametrize("fmt", ["hostname", "email"])
def test_suite_format_files(fmt, draft, draft_dir):
    cases = suite_cases(draft_dir, fmt)
    if not cases:
        pytest.skip(f"no {draft_dir} {fmt}.json in the vendored or shared suite")
    rejected_valid = []
    for data, valid, desc in cases:
        got = accepts(fmt, draft, data)
        assert not (got and not valid), f"false positive: {data!r} ({desc})"
        if valid and not got:
            rejected_valid.append(data)
    for data in rejected_valid:
        # the only valid values rejected are documented narrowings: R-LDH labels (A-labels)
        # in hostnames under draft-07 and later; quoted local parts in email addresses
        if fmt == "email":
            assert data.startswith('"'), data
        else:
            assert any(is_rldh(lbl.lower()) for lbl in data.split(".")), data


@pytest.mark.parametrize("fmt,draft_dir", [("idn-hostname", "draft2020-12"),
                                           ("idn-email", "draft2020-12")])
def test_suite_idn_files_have_a_labels_that_email_accepts(fmt, draft_dir):
    # the A-label form of every valid idn-hostname is an LDH domain email accepts
    cases = suite_cases(draft_dir, fmt)
    if not cases:
        pytest.skip(f"no {draft_dir} {fmt}.json")
    checked = 0
    for data, valid, _desc in cases:
        host = data.rpartition("@")[2]
        try:
            alabel = idna.encode(host).decode("ascii")
        except (idna.IDNAError, UnicodeError):
            continue
        if not valid or not host or len(alabel) > 253:
            continue
        checked += 1
        assert accepts("email", "2020-12", "user@" + alabel), alabel
        assert accepts("hostname", "4", alabel), alabel
    assert checked >= 3


# ---------------------------------------------------------------------------
# the idna codecs as oracles for A-labels
# ---------------------------------------------------------------------------

U_LABEL_CHARS = ("abcxyz09\u00e4\u00f6\u00fc\u00e9\u00df\u0430\u0431\u043a\u043e\u043c"
                 "\u4e2d\u6587\uac00\u0627\u0628")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(U_LABEL_CHARS, min_size=1, max_size=10), min_size=1, max_size=3))
def test_a_labels_from_idna(labels):
    try:
        alabels = [idna.encode(lbl).decode("ascii") for lbl in labels]
    except (idna.IDNAError, UnicodeError):
        return  # not a valid IDNA2008 label (mixed scripts, bidi, ...)
    host = ".".join(alabels)
    if len(host) > 200:
        return
    # Python's IDNA2003 codec agrees on these Punycode forms (an independent encoder)
    for lbl, a in zip(labels, alabels):
        if a.startswith("xn--") and lbl == lbl.lower() and "\u00df" not in lbl:
            assert lbl.encode("idna").decode("ascii") == a
    assert accepts("email", "2020-12", "someone@" + host), host
    assert accepts("email", "4", "someone@" + host), host
    assert accepts("hostname", "4", host), host
    has_alabel = any(a.startswith("xn--") for a in alabels)
    assert accepts("hostname", "2020-12", host) == (not has_alabel), host
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    assert checker.conforms(host, "hostname") and checker.conforms("someone@" + host, "email")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text("abz019-", min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_invalid_a_labels(tail, rng: random.Random):
    label = "xn--" + tail
    try:
        idna.decode(label)
        valid = True
    except (idna.IDNAError, UnicodeError):
        valid = False
    ldh = not label.endswith("-") and len(label) <= 63
    # draft-07+ hostname: never accepted (valid or not); draft-04 and email: any LDH label
    assert not accepts("hostname", "2020-12", label + ".example")
    assert accepts("hostname", "4", label + ".example") == ldh
    assert accepts("email", "2020-12", "a@" + label + ".example") == ldh
    if not valid:
        assert not accepts("hostname", "7", label), label
