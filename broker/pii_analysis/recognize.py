"""Pattern recognition inside a pool worker: Presidio's predefined recognizers (same patterns,
checksums and context words as stock Presidio) plus a tenant's custom ones, made cheap by running
each recognizer only where it can match.

Why it is equivalent: every predefined pattern recognizer except URL/DATE/UUID/MAC needs a digit
(IP: a digit or ':', e-mail: '@') and its matches never contain two consecutive tokens without
one. So a recognizer runs once over a *projection*: the whitespace-delimited tokens holding a
trigger character, one token of margin each side, joined by a separator no pattern can cross.
Window edges sit on whitespace, so `\\b` and look-arounds see what they would in the full text.
Context words are matched like Presidio's LemmaContextAwareEnhancer (substring, the 5 keywords
before the match) on lower-cased words, which needs no tagger: the costliest part of stock
Presidio's context step is walking spaCy tokens once per result.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

import phonenumbers
import regex
from phonenumbers import PhoneMetadata, re_util
from presidio_analyzer import EntityRecognizer, RecognizerResult
from presidio_analyzer.nlp_engine import NlpArtifacts
from presidio_analyzer.predefined_recognizers import PhoneRecognizer
from presidio_analyzer.recognizer_registry import RecognizerRegistryProvider
from spacy.lang.en.stop_words import STOP_WORDS

from core.policy.pii import PATTERN_FLAGS, CustomRecognizer

CONTEXT_FACTOR = 0.35  # LemmaContextAwareEnhancer defaults
CONTEXT_MIN_SCORE = 0.4
CONTEXT_PREFIX_WORDS = 5
CUSTOM_REGEX_TIMEOUT_S = 2.0  # a tenant regex that backtracks this long fails the job (closed)

_SEP = " \x00 "  # joins projection windows: whitespace around a character no pattern accepts
_DIGIT = re.compile(r"\S*\d\S*")
_DIGIT_OR_COLON = re.compile(r"\S*[\d:]\S*")
_AT = re.compile(r"\S*@\S*")
# Which trigger scopes each predefined entity type; absent: the whole text.
SCOPES: dict[str, re.Pattern[str]] = {
    **{
        e: _DIGIT
        for e in (
            "CREDIT_CARD",
            "US_SSN",
            "US_ITIN",
            "US_BANK_NUMBER",
            "PHONE_NUMBER",
            "UK_NHS",
            "US_PASSPORT",
            "IBAN_CODE",
            "CRYPTO",
            "MEDICAL_LICENSE",
            "US_DRIVER_LICENSE",
        )
    },
    "IP_ADDRESS": _DIGIT_OR_COLON,
    "EMAIL_ADDRESS": _AT,
}


class Projection:
    """The windows of `text` around trigger tokens, joined; maps offsets back to `text`."""

    def __init__(self, text: str, trigger: re.Pattern[str]) -> None:
        windows: list[tuple[int, int]] = []
        for m in trigger.finditer(text):
            a, b = _prev_token_start(text, m.start()), _next_token_end(text, m.end())
            if windows and a <= windows[-1][1]:
                windows[-1] = (windows[-1][0], max(b, windows[-1][1]))
            else:
                windows.append((a, b))
        self.origins = [a for a, _ in windows]
        self.starts: list[int] = []
        pos = 0
        for a, b in windows:
            self.starts.append(pos)
            pos += b - a + len(_SEP)
        self.text = _SEP.join(text[a:b] for a, b in windows)

    def to_text(self, start: int, end: int) -> tuple[int, int]:
        i = bisect.bisect_right(self.starts, start) - 1
        shift = self.origins[i] - self.starts[i]
        return start + shift, end + shift


def _prev_token_start(text: str, i: int) -> int:
    j = i - 1
    while j >= 0 and text[j].isspace():
        j -= 1
    if j < 0:
        return i
    while j >= 0 and not text[j].isspace():
        j -= 1
    return j + 1


def _next_token_end(text: str, i: int) -> int:
    n = len(text)
    j = i
    while j < n and text[j].isspace():
        j += 1
    if j == n:
        return i
    while j < n and not text[j].isspace():
        j += 1
    return j


class _PhoneMatcher(phonenumbers.PhoneNumberMatcher):
    """phonenumbers' matcher, minus `parse` calls whose outcome cannot change the recognizer's
    output. `_parse_and_verify` is the library's per-candidate step; it is skipped (None) for
    - candidates with too few digits to be valid: with the VALID leniency a match needs a national
      number of at least the region's shortest possible length, or an international one (IDD >= 2
      digits + country code + >= 4 digits; '+' + >= 5 digits);
    - candidates inside a span an earlier region already matched: all phone results score the
      same, and Presidio drops a result contained in another of equal score.
    Tests compare the output with stock PhoneRecognizer's on the labelled set."""

    def __init__(self, text: str, region: str, leniency: int, matched: list[tuple[int, int]]) -> None:
        super().__init__(text, region, leniency=leniency)
        self._min_digits = _min_digits(region)
        self._matched = matched

    def _skip(self, candidate: str, offset: int) -> bool:
        digits = sum(c.isdigit() for c in candidate)
        if digits < (5 if ("+" in candidate or "\uff0b" in candidate) else self._min_digits):
            return True
        end = offset + len(candidate)
        return any(a <= offset and end <= b for a, b in self._matched)

    def _extract_match(self, candidate: str, offset: int) -> phonenumbers.PhoneNumberMatch | None:
        # Inner matches are sub-strings: if the whole candidate is skipped, so are they.
        return None if self._skip(candidate, offset) else super()._extract_match(candidate, offset)

    def _parse_and_verify(self, candidate: str, offset: int) -> phonenumbers.PhoneNumberMatch | None:
        return None if self._skip(candidate, offset) else super()._parse_and_verify(candidate, offset)


_MIN_DIGITS: dict[str, int] = {}
if hasattr(re_util, "enable_pattern_cache"):  # its metadata regexes overflow `re`'s 512-entry cache
    re_util.enable_pattern_cache()


def _min_digits(region: str) -> int:
    if region not in _MIN_DIGITS:
        md = PhoneMetadata.metadata_for_region(region)
        desc = md.general_desc if md is not None else None
        lengths = desc.possible_length if desc is not None else ()
        _MIN_DIGITS[region] = min(min(lengths, default=1), 7)
    return _MIN_DIGITS[region]


class FastPhoneRecognizer(PhoneRecognizer):
    """Presidio's PhoneRecognizer.analyze with the matcher above."""

    def analyze(
        self, text: str, entities: list[str], nlp_artifacts: NlpArtifacts | None = None
    ) -> list[RecognizerResult]:
        results = []
        matched: list[tuple[int, int]] = []
        leniency = self.leniency
        assert leniency is not None, "Recognizers copies stock PhoneRecognizer's leniency (1)"
        for region in self.supported_regions:
            for match in _PhoneMatcher(text, region, leniency, matched):
                matched.append((match.start, match.end))
                try:
                    found = phonenumbers.region_code_for_number(phonenumbers.parse(match.raw_string))
                except phonenumbers.NumberParseException:
                    found = region
                results.append(self._get_recognizer_result(match, text, found, nlp_artifacts))
        return EntityRecognizer.remove_duplicates(results)


@dataclass
class Custom:
    """A tenant recognizer, run by us rather than Presidio's PatternRecognizer because Presidio
    swallows a regex timeout (silently fail-open); here it fails the job, which fails closed."""

    entity_type: str
    patterns: list[tuple[regex.Pattern[str], float]]
    context: list[str]

    @classmethod
    def build(cls, spec: CustomRecognizer) -> Custom:
        pats = [(regex.compile(p.regex, PATTERN_FLAGS), p.score) for p in spec.patterns]
        if spec.deny_list:  # the regex Presidio builds for a deny-list
            words = "|".join(regex.escape(w) for w in spec.deny_list)
            pats.append((regex.compile(rf"(?:^|(?<=\W))({words})(?:(?=\W)|$)", PATTERN_FLAGS), spec.deny_list_score))
        return cls(spec.entity_type, pats, [w.lower() for w in spec.context])

    def analyze(self, text: str) -> list[RecognizerResult]:
        out = []
        for pat, score in self.patterns:
            for m in pat.finditer(text, timeout=CUSTOM_REGEX_TIMEOUT_S):
                if m.end() > m.start():
                    out.append(RecognizerResult(self.entity_type, m.start(), m.end(), score))
        return out


class Recognizers:
    """Presidio's default English recognizers, indexed by entity type; built once per worker."""

    def __init__(self) -> None:
        registry = RecognizerRegistryProvider(
            registry_configuration={"supported_languages": ["en"]}
        ).create_recognizer_registry()
        self.by_entity: dict[str, list[EntityRecognizer]] = {}
        for rec in registry.recognizers:
            if type(rec) is PhoneRecognizer:
                rec = FastPhoneRecognizer(
                    context=rec.context, supported_regions=rec.supported_regions, leniency=rec.leniency
                )
            for entity in rec.supported_entities:
                self.by_entity.setdefault(entity, []).append(rec)

    def analyze(self, text: str, entities: tuple[str, ...], custom: list[Custom]) -> list[RecognizerResult]:
        """Pattern results with context applied, before threshold and de-duplication."""
        results: list[RecognizerResult] = []
        contexts: list[list[str]] = []
        projections: dict[int, Projection] = {}
        for entity in entities:
            scope = SCOPES.get(entity)
            for rec in self.by_entity.get(entity, ()):
                if scope is None:
                    # Pattern recognizers take no NLP artifacts; the base class's annotation wants them.
                    found = rec.analyze(text, [entity], None)  # type: ignore[arg-type]
                else:
                    proj = projections.get(id(scope))
                    if proj is None:
                        proj = projections[id(scope)] = Projection(text, scope)
                    if not proj.text:
                        continue
                    found = rec.analyze(proj.text, [entity], None)  # type: ignore[arg-type]
                    for r in found:
                        r.start, r.end = proj.to_text(r.start, r.end)
                results += found
                contexts += [rec.context or []] * len(found)
        for c in custom:
            found = c.analyze(text)
            results += found
            contexts += [c.context] * len(found)
        for r, words in zip(results, contexts, strict=True):
            if words and _supported_by_context(text, r.start, words):
                r.score = min(1.0, max(r.score + CONTEXT_FACTOR, CONTEXT_MIN_SCORE))
        return results


def _supported_by_context(text: str, start: int, context: list[str]) -> bool:
    """Presidio's rule: a context word is a substring of one of the 5 keywords (words that are
    not stop words or punctuation) before the match, or of the match's own first word. Tokens are
    split like spaCy's where it matters (punctuation off the ends, ':' splits), and a word whose
    plain inflection is a stop word counts as one ("calls" -> "call", a spaCy stop word)."""
    before = text[max(0, start - 160) : start].split()
    keywords: list[str] = []
    for token in reversed(before[1:] if start > 160 else before):  # [0] may be cut mid-word
        for word in reversed(token.strip(_PUNCT).lower().split(":")):
            if word and not _is_stop(word):
                keywords.append(word)
        if len(keywords) >= CONTEXT_PREFIX_WORDS:
            break
    keywords = keywords[:CONTEXT_PREFIX_WORDS]
    first = text[start : start + 64].split(maxsplit=1)
    if first:
        keywords.append(first[0].strip(_PUNCT).lower())
    return any(c in k for c in context for k in keywords)


_PUNCT = "!\"#$%&'()*+,-./;<=>?@[\\]^_`{|}~“”‘’…"


def _is_stop(word: str) -> bool:
    if word in STOP_WORDS:
        return True
    return any(word.endswith(suf) and word[: -len(suf)] in STOP_WORDS for suf in ("s", "es", "ed", "d", "ing"))


def finalize(
    results: list[RecognizerResult],
    text: str,
    min_score: float,
    allow: frozenset[str],
    lo: int = 0,
    hi: int | None = None,
) -> list[tuple[str, int, int, float]]:
    """Presidio's order: threshold, de-duplicate, allow-list; then only findings overlapping
    [lo, hi): the rest lie in a chunk's lead-in or lead-out and its neighbour reports them (one
    straddling a cut is reported whole by both, and the engine keeps one)."""
    hi = len(text) if hi is None else hi
    kept = [r for r in results if r.score >= min_score]
    kept = EntityRecognizer.remove_duplicates(kept)
    return sorted(
        (r.entity_type, r.start, r.end, round(float(r.score), 4))
        for r in kept
        if r.end > lo and r.start < hi and text[r.start : r.end] not in allow
    )
