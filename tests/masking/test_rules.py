"""The masking engine (recovery.masking): what each kind of rule hides, and bad rules."""

import time

import pytest
from django.core.exceptions import ValidationError

from recovery.bodies.decode import Decoded
from recovery.masking.engine import MASK, WITHHELD, Masker, compile_rule, parse_json_path
from recovery.models import MaskRule

SECRET = "4111-1111-1111-1111"


def masker(*rules):
    return Masker(
        headers=[compile_rule(k, p) for k, p in rules if k == "header"],
        paths=[compile_rule(k, p) for k, p in rules if k == "json_path"],
        regexes=[compile_rule(k, p) for k, p in rules if k == "regex"],
    )


def test_it_masks_headers_by_name_in_any_case():
    shown = masker(("header", "X-Card")).headers({"x-card": SECRET, "x-other": "kept"})
    assert shown == {"x-card": MASK, "x-other": "kept"}


@pytest.mark.parametrize(
    "path, body, expected",
    [
        (
            "$.card.number",
            {"card": {"number": SECRET, "cvv": 1}},
            {"card": {"number": MASK, "cvv": 1}},
        ),
        ("card.number", {"card": {"number": SECRET}}, {"card": {"number": MASK}}),
        (
            "$.items[*].pan",
            {"items": [{"pan": SECRET}, {"pan": "2"}]},
            {"items": [{"pan": MASK}, {"pan": MASK}]},
        ),
        ("$.items[1]", {"items": ["a", SECRET]}, {"items": ["a", MASK]}),
        (
            "$..pan",
            {"a": {"b": [{"pan": SECRET}]}, "pan": "x"},
            {"a": {"b": [{"pan": MASK}]}, "pan": MASK},
        ),
        ("$['card no']", {"card no": SECRET}, {"card no": MASK}),
        ("$.card", {"card": {"number": SECRET}}, {"card": MASK}),
        ("$.absent", {"card": SECRET}, {"card": SECRET}),
    ],
)
def test_it_masks_json_paths(path, body, expected):
    assert masker(("json_path", path)).value(body) == expected


def test_a_text_body_keeps_its_formatting_when_no_path_matches():
    text = '{ "a" : 1 }'
    assert masker(("json_path", "$.b")).text(text) == text
    assert SECRET not in masker(("json_path", "$.b")).text(f'{{"b": "{SECRET}"}}')


def test_regexes_mask_text_and_binary_bodies_alike():
    rule = masker(("regex", r"\d{4}-\d{4}-\d{4}-\d{4}"))
    assert rule.text(f"card {SECRET} ok") == f"card {MASK} ok"
    binary = b"\xff\x00" + SECRET.encode() + b"\xfe"
    assert rule.body(binary) == b"\xff\x00" + MASK.encode() + b"\xfe"


def test_a_decoded_document_is_masked_and_cannot_be_edited_from_its_masked_form():
    decoded = Decoded(chain=["gzip", "json"], data=b"", value={"pan": SECRET}, text="x")
    shown = masker(("json_path", "$.pan")).decoded(decoded)
    assert shown.value == {"pan": MASK} and SECRET not in shown.text
    assert decoded.value == {"pan": SECRET}  # the original is untouched
    assert shown.document is None


@pytest.mark.parametrize(
    "kind, pattern, error",
    [
        ("regex", "(unclosed", "not a valid regular expression"),
        ("regex", "a*", "matches the empty text"),
        ("json_path", "$.a[", "not a JSON path"),
        ("json_path", "$", "names at least one key"),
        ("json_path", "$.a b", "not a JSON path"),
        ("header", "  ", "a header name is needed"),
    ],
)
def test_a_bad_rule_is_a_validation_error(kind, pattern, error):
    with pytest.raises(ValidationError) as caught:
        MaskRule(kind=kind, pattern=pattern).clean()
    assert error in " ".join(caught.value.message_dict["pattern"])


def test_a_path_parses_into_steps():
    assert parse_json_path("$.a[2]..b") == [("key", "a"), ("index", 2), ("deep", "b")]


def test_catastrophic_backtracking_is_cut_and_the_content_withheld(settings):
    settings.MASK_REGEX_TIMEOUT_MS = 50
    runaway = masker(("regex", r"(a|aa)+$"))
    started = time.monotonic()
    shown = runaway.text("a" * 60 + "!")
    assert time.monotonic() - started < 2
    assert shown == WITHHELD
    assert runaway.body(b"a" * 60 + b"!") == WITHHELD.encode()


@pytest.mark.django_db
def test_a_stored_rule_that_no_longer_compiles_masks_whole_bodies(client, admin_user, caplog):
    from recovery.models.masking import MaskingRules

    rule = MaskRule.objects.create(kind="regex", pattern="(unclosed")  # past the form
    shown = MaskingRules.load().team_masker(None)
    assert shown.body(b"anything at all") == MASK.encode()
    assert "cannot be applied" in caplog.text
    client.force_login(admin_user)
    page = client.get("/masking/").content.decode()
    assert f'id="mask-rule-{rule.pk}-matches">invalid: it masks whole bodies' in page


@pytest.mark.django_db
def test_a_runaway_rule_cannot_hold_the_detail_page(client, viewer, settings):
    from tests.helpers import make_message

    settings.MASK_REGEX_TIMEOUT_MS = 50
    MaskRule.objects.create(kind="regex", pattern=r"(a|aa)+$")
    message = make_message(body=b"a" * 60 + b"!", content_type="text/plain")
    client.force_login(viewer)
    started = time.monotonic()
    page = client.get(f"/messages/{message.pk}/").content.decode()
    assert time.monotonic() - started < 5  # unbounded, this pattern runs for minutes
    assert WITHHELD in page and "a" * 60 not in page
