"""Hostname, email and IDN formats per draft, A-labels included (structgen.frontends.json_schema.formats).

Oracles: the JSON-Schema-Test-Suite's optional format files (draft-07 and 2020-12), the
``idna`` package (IDNA2008) and Python's own ``encodings.idna`` codec for A-labels, and
``jsonschema``'s format checker. The documented choices
(structgen/frontends/json_schema/formats.py, docs/formats.md):

* ``email``, every draft: RFC 5321 LDH domain labels, A-labels accepted unchecked;
* ``hostname``, draft-04/06: LDH labels, A-labels accepted unchecked;
* ``hostname``, draft-07 and later: validation (``compile_json_schema``, value checks on)
  accepts an R-LDH label (``--`` in positions 3-4) only as a valid A-label, checked per
  value with ``idna``; generation (value checks off) never writes one;
* ``idn-hostname`` / ``idn-email``: validation checks each value (RFC 5890-5893 / 6531);
  generation writes their ASCII safe subsets, every value of which is valid.
"""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path

import idna
import jsonschema
import pytest
from _toy_vocab import ToyVocab
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structgen import compile_json_schema
from structgen.errors import MatcherUsageError
from structgen.frontends.constraint import compile_constraint
from structgen.masks.matcher import Matcher

ROOT = Path(__file__).resolve().parent.parent
SUITES = [ROOT / "tests" / "data" / "json-schema-test-suite" / "tests",
          ROOT.parent / "shared" / "data" / "json-schema-test-suite" / "tests",
          Path("/work/shared/data/json-schema-test-suite/tests")]
DRAFT_URI = {"4": "http://json-schema.org/draft-04/schema#",
             "6": "http://json-schema.org/draft-06/schema#",
             "7": "http://json-schema.org/draft-07/schema#",
             "2020-12": "https://json-schema.org/draft/2020-12/schema"}

_GRAMMARS: dict[tuple[str, str, bool], object] = {}


def validating_grammar(schema, **options):
    """The schema in validation's language (every spelling of every valid document)."""
    return compile_json_schema(schema, for_generation=False, **options)


def grammar(fmt: str, draft: str, checks: bool = True):
    """The validation grammar (value checks on) or the generation one (off)."""
    key = (fmt, draft, checks)
    if key not in _GRAMMARS:
        _GRAMMARS[key] = validating_grammar({"$schema": DRAFT_URI[draft], "type": "string",
                                              "format": fmt}, value_checks=checks)
    return _GRAMMARS[key]


def accepts(fmt: str, draft: str, value: str, checks: bool = True) -> bool:
    return grammar(fmt, draft, checks).accepts(json.dumps(value, ensure_ascii=False))


def idna_ok(host: str) -> bool:
    try:
        idna.encode(host)
        return True
    except (idna.IDNAError, UnicodeError):
        return False


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
        for s in ["xn--bcher-kva.example", "xn--j1aef", "a--b.com", "ab--c.com", "xn--X"]:
            assert accepts("hostname", draft, s), (draft, s)
    for draft in ("7", "2020-12"):
        assert accepts("hostname", draft, "a--b.com")
        # validation: valid A-labels accepted; generation: no R-LDH label at all
        for s in ["xn--bcher-kva.example", "XN--BCHER-KVA.example", "a.xn--j1aef",
                  "xn--9n2bp8q.xn--9t4b11yi5a"]:
            assert accepts("hostname", draft, s), (draft, s)
            assert not accepts("hostname", draft, s, checks=False), (draft, s)
        for s in ["xn--X", "ab--c.com", "XN--aa---o47jg78q", "xn--bcher-kvb.example", "a.xn--"]:
            assert not accepts("hostname", draft, s), (draft, s)
            assert not accepts("hostname", draft, s, checks=False), (draft, s)
    for draft in DRAFT_URI:
        for s in ["-a.com", "a-.com", "a..b", "a_b.com", "example.com.", "a" * 64]:
            assert not accepts("hostname", draft, s), (draft, s)


@pytest.mark.parametrize("fmt", ["hostname", "idn-hostname", "idn-email"])
def test_checked_grammars_validate_and_generation_grammars_mask(fmt):
    schema = {"type": "string", "format": fmt}
    vocab = ToyVocab([b"a", b'"', b".", b"@"])
    assert validating_grammar(schema).has_value_checks
    with pytest.raises(MatcherUsageError, match="generation"):
        Matcher(validating_grammar(schema), vocab)
    gen = compile_constraint("json", schema)  # generation: the safe subset, no checks
    assert not gen.has_value_checks
    Matcher(gen, vocab)
    for v in ["a.b", "a@b.c", "xn--bcher-kva", "例子.测试"]:
        if gen.accepts(json.dumps(v)):  # the safe subset is valid under the checks
            assert validating_grammar(schema).accepts(json.dumps(v)), v


def test_idn_formats_validate_per_value():
    for s in ["例子.测试", "münchen.de", "xn--mnchen-3ya.de", "a\u3002b", "EXAMPLE.com", "\u0627\u0628.com"]:
        assert accepts("idn-hostname", "2020-12", s) and idna_ok(s), s
    for s in ["", "example.", "example\u3002", "xn--X", "-a.com", "0a.\u05d0", "a" * 64 + ".com",
              "ab--c.com", "a b.com"]:
        assert not accepts("idn-hostname", "2020-12", s), s
    for s in ["user@例子.测试", "我@例子.广告", "用户@münchen.de", "a.b@[127.0.0.1]", "x@[IPv6:::1]",
              "user@cafe\u0301.com", "a@b.xn--j1aef", '"a b"@c.com', '"ü\\\\"@c.com']:
        assert accepts("idn-email", "2020-12", s), s
    for s in ["2962", "@a.com", "a@", "a..b@c.com", ".a@b.com", "a@xn--X.com", "a b@c.com", "a@b@c.com",
              "a@[1.2.3.256]", "a@[IPv6:fe80::1%eth0]", "x" * 65 + "@a.com", '"a"b"@c.com']:
        assert not accepts("idn-email", "2020-12", s), s


def test_value_checks_see_every_escape_spelling():
    for fmt, v in [("hostname", "xn--bcher-kva.example"), ("idn-hostname", "münchen.de"),
                   ("idn-email", "我@例子.广告")]:
        all_u = '"' + "".join(f"\\u{ord(c):04X}" for c in v) + '"'
        assert json.loads(all_u) == v
        assert grammar(fmt, "2020-12").accepts(all_u), all_u
        assert grammar(fmt, "2020-12").accepts(json.dumps(v)), v
    bad = '"' + "".join(f"\\u{ord(c):04x}" for c in "xn--X.example") + '"'
    assert not grammar("hostname", "2020-12").accepts(bad)


def test_value_checks_inside_structures():
    # an alternative without the check still accepts the value
    g = validating_grammar({"anyOf": [{"type": "string", "format": "hostname"},
                                       {"type": "string", "pattern": "^xn--X$"}]})
    assert g.accepts('"xn--X"') and g.accepts('"xn--bcher-kva"') and not g.accepts('"xn--Y"')
    # property names and array items are checked
    g = validating_grammar({"type": "object", "propertyNames": {"format": "idn-hostname"},
                             "additionalProperties": {"type": "array",
                                                      "items": {"format": "idn-email"}}})
    assert g.accepts('{"例子.测试":["我@例子.广告","a@b.c"],"a.b":[]}')
    assert not g.accepts('{"例子.测试":["我@例子.广告","a@xn--X"]}')
    assert not g.accepts('{"xn--X":[]}')
    assert g.accepts_prefix('{"a.b":["x@y.z",') and not g.accepts_prefix('{"a.b":["x@xn--X",')
    # a checked format under an intersection of alternatives gets its safe subset (narrowing)
    g = validating_grammar({"allOf": [{"anyOf": [{"format": "hostname"}, {"maxLength": 2}]},
                                       {"anyOf": [{"pattern": "^x"}, {"minLength": 30}]}],
                             "type": "string"})
    assert g.accepts('"xample.com"') and not g.accepts('"xn--X"')


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
@pytest.mark.parametrize("fmt", ["hostname", "email", "idn-hostname", "idn-email"])
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
        if accepts(fmt, draft, data, checks=False):  # generation's safe subset
            assert valid, f"generation grammar accepts {data!r} ({desc})"
    # the only valid values rejected are documented narrowings: quoted local parts
    for data in rejected_valid:
        assert "email" in fmt and data.startswith('"'), data


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
        assert accepts("hostname", "2020-12", alabel), alabel
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
            try:
                assert lbl.encode("idna").decode("ascii") == a
            except UnicodeError:  # IDNA2003's bidi rule is stricter than IDNA2008's
                assert any(unicodedata.bidirectional(c) in ("R", "AL") for c in lbl), lbl
    assert accepts("email", "2020-12", "someone@" + host), host
    assert accepts("email", "4", "someone@" + host), host
    assert accepts("hostname", "4", host), host
    has_alabel = any(a.startswith("xn--") for a in alabels)
    assert accepts("hostname", "2020-12", host, checks=False) == (not has_alabel), host
    # validation checks the A-labels, and RFC 5893's rule for a name with an RTL label: every
    # label satisfies the Bidi Rule (idna checks it per label only for RTL labels)
    try:
        for lbl in labels:
            idna.check_bidi(lbl, check_ltr=True)
        bidi_ok = True
    except idna.IDNABidiError:
        bidi_ok = not any(unicodedata.bidirectional(c) in ("R", "AL", "AN") for lbl in labels for c in lbl)
    assert accepts("hostname", "2020-12", host) == bidi_ok, host
    assert accepts("idn-hostname", "2020-12", host) == bidi_ok, host
    assert accepts("idn-hostname", "2020-12", ".".join(labels)) == bidi_ok, labels
    assert accepts("idn-email", "2020-12", "someone@" + ".".join(labels)) == bidi_ok, labels
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
    # draft-07+ hostname: accepted iff a valid A-label (validation), never (generation);
    # draft-04 and email: any LDH label
    assert accepts("hostname", "2020-12", label + ".example") == (ldh and valid)
    assert accepts("idn-hostname", "2020-12", label + ".example") == (ldh and valid)
    assert not accepts("hostname", "2020-12", label + ".example", checks=False)
    assert accepts("hostname", "4", label + ".example") == ldh
    assert accepts("email", "2020-12", "a@" + label + ".example") == ldh
    if not valid:
        assert not accepts("hostname", "7", label), label


def test_value_checks_survive_the_disk_cache(tmp_path):
    # a fresh process that loads the grammar from disk has never imported the module that
    # registers the predicates: loading it must bring them
    import subprocess
    import sys

    code = ("import sys; from structgen.grammar_cache import {f}; "
            "g = {f}({{'type': 'string', 'format': 'hostname'}}, for_generation=False); "
            "print(g is not None and g.accepts('\"xn--bcher-kva.example\"'), "
            "g is not None and g.accepts('\"xn--X\"'), "
            "'structgen.frontends.json_schema.lower' in sys.modules)")
    env = {**__import__("os").environ, "STRUCTGEN_GRAMMAR_CACHE": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", code.format(f="compile_json_schema_cached")], env=env,
                           capture_output=True, text=True, timeout=300)
    assert first.stdout.split() == ["True", "False", "True"], first.stderr[-2000:]
    again = subprocess.run([sys.executable, "-c", code.format(f="cached_grammar")], env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.stdout.split() == ["True", "False", "False"], again.stderr[-2000:]
