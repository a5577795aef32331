#!/usr/bin/env python
"""Generate the MiniLM demo's English sentence corpus (``edgekit/demos/data/sentences.txt``).

    python scripts/make_sentences.py [--out PATH] [--count N] [--seed S]

Sentences are filled in from small per-topic word lists and a handful of templates (statements,
questions, instructions, compound and long multi-clause sentences), so lengths range from a few
words to past the 128-token demo sequence length. The output is deterministic for a seed: Python's
``random.Random`` is stable across versions for ``choice``, ``randint`` and ``shuffle``. The file is
generated once and shipped; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "edgekit" / "demos" / "data" / "sentences.txt"
log = logging.getLogger("make_sentences")


@dataclass(frozen=True)
class Topic:
    subjects: tuple[str, ...]
    verbs: tuple[tuple[str, str], ...]  # (past tense, base form)
    objects: tuple[str, ...]
    places: tuple[str, ...]
    adjectives: tuple[str, ...]


TOPICS: dict[str, Topic] = {
    "kitchen": Topic(
        subjects=("the chef", "my grandmother", "a young baker", "the night cook", "our neighbour", "the students"),
        verbs=(("baked", "bake"), ("seasoned", "season"), ("burned", "burn"), ("served", "serve"), ("tasted", "taste"), ("chopped", "chop")),
        objects=("a loaf of rye bread", "the tomato soup", "fresh pasta", "a lemon tart", "the onions", "a pot of rice", "roasted carrots"),
        places=("in the small kitchen", "at the market stall", "behind the restaurant", "on the camping stove", "at the cooking school"),
        adjectives=("spicy", "crisp", "bland", "warm", "sweet", "salty"),
    ),
    "travel": Topic(
        subjects=("the tourists", "a lonely cyclist", "the pilot", "my cousin", "the tour guide", "two hikers"),
        verbs=(("booked", "book"), ("missed", "miss"), ("photographed", "photograph"), ("crossed", "cross"), ("explored", "explore"), ("mapped", "map")),
        objects=("the last train", "an old stone bridge", "the mountain pass", "a cheap hotel room", "the harbour", "a narrow valley"),
        places=("near the border", "in a quiet village", "at the busy airport", "along the coast", "on the northern island"),
        adjectives=("crowded", "remote", "scenic", "delayed", "foggy", "famous"),
    ),
    "technology": Topic(
        subjects=("the engineers", "a junior developer", "the support team", "our robot", "the startup", "the system administrator"),
        verbs=(("deployed", "deploy"), ("debugged", "debug"), ("rewrote", "rewrite"), ("benchmarked", "benchmark"), ("patched", "patch"), ("tested", "test")),
        objects=("the database server", "a new mobile app", "the firmware update", "the search index", "a neural network", "the login page"),
        places=("in the data centre", "on the edge device", "during the night shift", "at the hackathon", "in the cloud"),
        adjectives=("slow", "buggy", "reliable", "secure", "outdated", "efficient"),
    ),
    "sports": Topic(
        subjects=("the goalkeeper", "the home team", "a veteran runner", "the coach", "the referee", "the young swimmer"),
        verbs=(("won", "win"), ("lost", "lose"), ("trained for", "train for"), ("watched", "watch"), ("postponed", "postpone"), ("celebrated", "celebrate")),
        objects=("the final match", "a marathon", "the relay race", "the championship", "a penalty kick", "the season opener"),
        places=("at the stadium", "in the rain", "on the muddy field", "at the indoor pool", "in front of a huge crowd"),
        adjectives=("tense", "thrilling", "exhausting", "historic", "unfair", "close"),
    ),
    "science": Topic(
        subjects=("the researchers", "a chemistry teacher", "the astronomer", "the lab assistant", "a biology student", "the physicist"),
        verbs=(("measured", "measure"), ("observed", "observe"), ("published", "publish"), ("repeated", "repeat"), ("analysed", "analyse"), ("predicted", "predict")),
        objects=("the reaction rate", "a distant comet", "the water samples", "the experiment", "a rare fossil", "the solar eclipse"),
        places=("in the laboratory", "at the observatory", "on the research ship", "in the field station", "under the microscope"),
        adjectives=("surprising", "precise", "noisy", "careful", "ancient", "faint"),
    ),
    "nature": Topic(
        subjects=("a red fox", "the old oak tree", "a flock of geese", "the river", "a curious cat", "the bees"),
        verbs=(("chased", "chase"), ("flooded", "flood"), ("crossed", "cross"), ("guarded", "guard"), ("visited", "visit"), ("avoided", "avoid")),
        objects=("the frozen pond", "a field of sunflowers", "the garden fence", "the meadow", "a hollow log", "the forest path"),
        places=("at dawn", "in early spring", "after the storm", "in the valley", "beneath the cliffs"),
        adjectives=("quiet", "wild", "muddy", "green", "windy", "cold"),
    ),
    "finance": Topic(
        subjects=("the bank", "a small business owner", "the accountant", "the city council", "investors", "the shop keeper"),
        verbs=(("raised", "raise"), ("cut", "cut"), ("audited", "audit"), ("approved", "approve"), ("borrowed", "borrow"), ("refunded", "refund")),
        objects=("the interest rate", "the annual budget", "a large loan", "the monthly invoices", "the ticket prices", "the pension fund"),
        places=("last quarter", "before the election", "at the annual meeting", "in the city centre", "during the recession"),
        adjectives=("risky", "modest", "generous", "volatile", "stable", "expensive"),
    ),
    "music": Topic(
        subjects=("the orchestra", "a street musician", "the choir", "my sister", "the drummer", "the band"),
        verbs=(("rehearsed", "rehearse"), ("recorded", "record"), ("composed", "compose"), ("performed", "perform"), ("tuned", "tune"), ("cancelled", "cancel")),
        objects=("a new symphony", "the old piano", "the concert", "a folk song", "the guitar solo", "their second album"),
        places=("in the concert hall", "at the summer festival", "in a basement studio", "on the town square", "at the wedding"),
        adjectives=("loud", "gentle", "haunting", "cheerful", "melancholy", "lively"),
    ),
}

TIMES = ("Yesterday", "Last winter", "On Monday morning", "Every weekend", "Late at night", "In 1998", "Twice a year", "This afternoon")
CONNECTIVES = ("but", "because", "although", "so", "while", "and")
NUMBERS = ("three", "seven", "twelve", "forty", "a hundred", "two thousand")


def _clause(rng: random.Random, topic: Topic) -> str:
    past, _ = rng.choice(topic.verbs)
    obj = rng.choice(topic.objects)
    if rng.random() < 0.4:
        obj = obj.replace("the ", f"the {rng.choice(topic.adjectives)} ", 1) if obj.startswith("the ") else obj
    clause = f"{rng.choice(topic.subjects)} {past} {obj}"
    if rng.random() < 0.5:
        clause += f" {rng.choice(topic.places)}"
    return clause


def _sentence(rng: random.Random) -> str:
    topic = TOPICS[rng.choice(sorted(TOPICS))]
    other = TOPICS[rng.choice(sorted(TOPICS))]
    form = rng.choices(
        ("short", "statement", "timed", "question", "instruction", "compound", "numeric", "long", "paragraph"),
        weights=(10, 16, 14, 12, 8, 16, 8, 12, 4),
    )[0]
    if form == "short":
        text = f"{rng.choice(topic.adjectives)} {rng.choice(topic.objects).removeprefix('the ')} today"
    elif form == "statement":
        text = _clause(rng, topic)
    elif form == "timed":
        text = f"{rng.choice(TIMES)}, {_clause(rng, topic)}"
    elif form == "question":
        _, base = rng.choice(topic.verbs)
        opener = rng.choice(("Why did", "When did", "How often did", "Did"))
        text = f"{opener} {rng.choice(topic.subjects)} {base} {rng.choice(topic.objects)} {rng.choice(topic.places)}?"
    elif form == "instruction":
        _, base = rng.choice(topic.verbs)
        text = f"please {base} {rng.choice(topic.objects)} {rng.choice(topic.places)} before {rng.choice(other.subjects)} arrives"
    elif form == "compound":
        text = f"{_clause(rng, topic)}, {rng.choice(CONNECTIVES)} {_clause(rng, other)}"
    elif form == "numeric":
        text = (
            f"{rng.choice(topic.subjects)} counted {rng.choice(NUMBERS)} {rng.choice(topic.adjectives)} "
            f"problems with {rng.choice(topic.objects)} and reported {rng.randint(2, 99)} of them"
        )
    elif form == "long":
        parts = [_clause(rng, rng.choice((topic, other))) for _ in range(rng.randint(3, 5))]
        text = f"{rng.choice(TIMES)}, " + ", ".join(f"{rng.choice(CONNECTIVES)} {p}" if i else p for i, p in enumerate(parts))
    else:  # paragraph: long enough to be truncated at 128 tokens
        parts = [_clause(rng, rng.choice((topic, other))) for _ in range(rng.randint(9, 14))]
        text = "; ".join(parts)
    text = text[0].upper() + text[1:]
    return text if text.endswith("?") else text + "."


def make_sentences(count: int, seed: int) -> list[str]:
    """``count`` distinct sentences, deterministic for ``seed``, in shuffled order."""
    rng = random.Random(seed)
    seen: dict[str, None] = {}
    attempts = 0
    while len(seen) < count:
        attempts += 1
        if attempts > count * 50:
            raise RuntimeError(f"could only make {len(seen)} distinct sentences; lower --count")
        seen.setdefault(_sentence(rng), None)
    sentences = list(seen)
    rng.shuffle(sentences)
    return sentences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output file (default: {DEFAULT_OUT})")
    parser.add_argument("--count", type=int, default=760, help="number of distinct sentences (default: 760)")
    parser.add_argument("--seed", type=int, default=2024, help="random seed (default: 2024)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    sentences = make_sentences(args.count, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    words = sorted(len(s.split()) for s in sentences)
    log.info("wrote %d sentences to %s (words per sentence: min %d, median %d, max %d)",
             len(sentences), args.out, words[0], words[len(words) // 2], words[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
