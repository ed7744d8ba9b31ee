"""NER inside a pool worker, run only where a name or place can be.

spaCy's `en_core_web_sm` costs ~0.13 ms per token here, so NER over a 1.5K-token turn alone is
~200 ms. English PERSON/LOCATION mentions contain a capitalised word, so the model runs only on
windows of a few words around *candidates*: capitalised words that are not stop words, and, at
the start of a sentence (where every word is capitalised), not common verbs/adverbs/adjectives
from the model's own lemma tables. Only the NER component runs (its tok2vec is its own; tagger,
parser and lemmatizer serve nothing here), and all windows of a job go through one `nlp.pipe`.
Measured on the labelled set (`loadtest/pii_bench.py`): recall equal to whole-text NER, precision
slightly higher (fewer spurious long-range entities).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

import regex
import spacy
from presidio_analyzer import RecognizerResult
from presidio_analyzer.nlp_engine.ner_model_configuration import MODEL_TO_PRESIDIO_ENTITY_MAPPING
from spacy.lang.en.stop_words import STOP_WORDS
from spacy.pipeline import Lemmatizer

from broker.pii_analysis.spacy_model import DEFAULT_MODEL, model_installed

NER_SCORE = 0.85  # Presidio's default score for spaCy entities
WINDOW_WORDS = 4  # words each side of a candidate: 3 was the smallest matching whole-text recall

_CANDIDATE = regex.compile(r"(?<![\p{L}\p{N}_])\p{Lu}\p{L}*\p{Ll}[\p{L}'’-]*")
_SENTENCE_START = regex.compile(r"(?:^|[.!?:;]|\n)[\s\"'“‘(\[*#>\-\d.)]*$")
_TOKEN = regex.compile(r"\S+")
# Capitalised words that are never a person or a place: day names, and months that are not also
# first names (April, May, June, August stay candidates).
NEVER = frozenset(
    [d + s for d in ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday") for s in ("", "s")]
    + ["january", "february", "march", "july", "september", "october", "november", "december"]
)
# At a sentence start, a WordNet noun with one of these suffixes is an abstract common noun
# ("Latency", "Migration", "Equipment"); suffixes that also end first names or surnames
# (-ence, -ance, -ing, -age, -ity) are left out.
_ABSTRACT = regex.compile(r"(?:tion|sion|ment|ness|ship|ism|ology|ency)s?$")


class Ner:
    def __init__(self, model: str = DEFAULT_MODEL) -> None:
        if not model_installed(model):  # never let spaCy or Presidio try to download one
            raise RuntimeError(f"spaCy model {model!r} is not installed")
        self.nlp = spacy.load(model)
        self.nlp.select_pipes(enable="ner")
        lemmas: Mapping[str, list[str]] = {}
        if "lemmatizer" in self.nlp.component_names:
            lemmatizer = self.nlp.get_pipe("lemmatizer")
            assert isinstance(lemmatizer, Lemmatizer)  # the en_core_web models' rule-based one
            lemmas = lemmatizer.lookups.get_table("lemma_index")
        # Sentence-initial words in these sets are ordinary English, not names (nouns are not
        # used: WordNet's noun list holds "boston" and "james").
        self.common = set(STOP_WORDS)
        for pos in ("verb", "adv", "adj"):
            self.common.update(lemmas.get(pos, ()))
        self.nouns = set(lemmas.get("noun", ()))

    def candidates(self, text: str) -> list[tuple[int, int]]:
        out = []
        for m in _CANDIDATE.finditer(text):
            word = m.group().lower()
            if word in STOP_WORDS or word in NEVER:
                continue
            if (
                word in self.common or (_ABSTRACT.search(word) and word.rstrip("s") in self.nouns)
            ) and _SENTENCE_START.search(text, max(0, m.start() - 12), m.start()):
                continue
            out.append(m.span())
        return out

    def windows(self, text: str, lo: int = 0, hi: int | None = None) -> list[tuple[int, int]]:
        hi = len(text) if hi is None else hi
        cands = [c for c in self.candidates(text) if c[1] > lo and c[0] < hi]
        if not cands:
            return []
        tokens = [m.span() for m in _TOKEN.finditer(text)]
        starts = [a for a, _ in tokens]
        merged: list[list[int]] = []
        for a, b in cands:
            i = max(0, bisect.bisect_right(starts, a) - 1 - WINDOW_WORDS)
            j = min(len(tokens) - 1, bisect.bisect_right(starts, b - 1) - 1 + WINDOW_WORDS)
            if merged and i <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], j)
            else:
                merged.append([i, j])
        return [(tokens[i][0], tokens[j][1]) for i, j in merged]

    def analyze(self, texts: list[tuple[str, int, int]], entities: tuple[str, ...]) -> list[list[RecognizerResult]]:
        """For each (text, lo, hi): results of the wanted types near [lo, hi), text offsets."""
        wanted = set(entities)
        jobs = [(k, a, b) for k, (text, lo, hi) in enumerate(texts) for a, b in self.windows(text, lo, hi)]
        out: list[list[RecognizerResult]] = [[] for _ in texts]
        docs = self.nlp.pipe((texts[k][0][a:b] for k, a, b in jobs), batch_size=64)
        for (k, a, _), doc in zip(jobs, docs, strict=True):
            for ent in doc.ents:
                etype = MODEL_TO_PRESIDIO_ENTITY_MAPPING.get(ent.label_)
                if etype in wanted:
                    out[k].append(RecognizerResult(etype, a + ent.start_char, a + ent.end_char, NER_SCORE))
        return out
