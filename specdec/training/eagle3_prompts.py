"""Chat-task training prompts for EAGLE-3 heads (recipe ``tasks``), built from training documents.

A head learns the target's greedy *chat answers*; the held-out sets (Spec-Bench) ask for writing,
question answering, summaries, translations, word problems and answers over retrieved passages.
:func:`task_prompts` turns documents of a training corpus (never a held-out set) into user turns of
those kinds, in equal shares:

- ``summarize``: "Summarize: <excerpt>";
- ``rag``: "<excerpt>\\n<question about it>" (templated questions about a name or phrase of the excerpt);
- ``qa``: a short templated question about a name or phrase of a document, asked alone;
- ``translate``: "Translate German to English: <the target's German rendering of a sentence>" (stage 1:
  "Translate English to German: <sentence>");
- ``math``: a templated arithmetic word problem (names and numbers drawn from the seed);
- ``write``: an instruction (blog post, email, explanation, story, list, ...) about a document's topic.

Stage-1 prompts (the German sentences) are answered by the target with a few greedy tokens
(:func:`task_prompts` takes the answering function), so a run only needs the target and the corpus.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

TASKS = ("summarize", "rag", "qa", "translate", "math", "write")
Answer = Callable[[list[str], int], list[str]]  # user turns, max new tokens -> the target's greedy answers

_WRITE = ("Write a short blog post about {t}.", "Write a professional email about {t}.",
          "Explain {t} in simple terms.", "Give three tips related to {t}.", "Write a short story about {t}.",
          "What are the advantages and disadvantages of {t}?", "Describe {t} to a beginner.",
          "Write a persuasive paragraph about {t}.", "List the key facts about {t}.",
          "Pretend you are an expert on {t}. What would you say to a student?")
_NAMES = ("Tom", "Maria", "James", "Aisha", "Lena", "Carlos", "Priya", "John", "Emma", "Ken")
_ITEMS = ("apples", "books", "cookies", "marbles", "stickers", "pencils", "cupcakes", "stamps")


def _math_problem(r: random.Random) -> str:
    n, m = r.choice(_NAMES), r.choice(_NAMES)
    it = r.choice(_ITEMS)
    a, b, c, p = r.randint(3, 40), r.randint(2, 12), r.randint(2, 6), r.choice((2, 3, 4, 5, 10, 12, 15, 20))
    forms = (
        f"{n} has {a} {it}. {m} gives {n} {b} more and then {n} eats {c}. How many {it} does {n} have now?",
        f"{n} buys {b} boxes of {it}. Each box has {c} {it} and costs ${p}. How much does {n} spend in total?",
        f"A store sells {it} for ${p} each. {n} buys {b} and pays with a ${p * b + a} bill. How much change does "
        f"{n} get?",
        f"{n} reads {b} pages on Monday and {c} times as many pages on Tuesday. How many pages did {n} read in "
        f"the two days?",
        f"{n} earns ${p} an hour and works {b} hours a day for {c} days. How much does {n} earn?",
        f"There are {a} students in a class. {b} of them are absent and the rest sit in groups of {c}. How many "
        f"full groups are there?",
        f"{n} is {a} years old. {m} is {b} years older than {n}. How old will {m} be in {c} years?",
        f"A recipe needs {b} cups of flour for {c} cakes. How many cups of flour are needed for {c * p} cakes?",
    )
    return r.choice(forms)


def _sentences(doc: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", doc) if 40 <= len(s.strip()) <= 300]


def _excerpt(doc: str, max_chars: int) -> str:
    if len(doc) <= max_chars:
        return doc.strip()
    cut = doc[:max_chars]
    end = max(cut.rfind(". "), cut.rfind(".\n"))
    return (cut[:end + 1] if end > max_chars // 2 else cut).strip()


_QA = ("What is {x}?", "Who is {x}?", "Where is {x}?", "When was {x} founded?", "Tell me about {x}.",
       "Why is {x} important?", "What is {x} known for?", "How does {x} work?")
_RAG = ("What is the main point of this text?", "What does the text say about {x}?", "Who is {x}?",
        "Summarize what the text says about {x}.", "According to the text, why is {x} mentioned?",
        "What is {x}?", "Which facts does the text give about {x}?")


def _name(doc: str, r: random.Random) -> str:
    """A capitalised word or two from inside a sentence of ``doc`` (a name, a place, a product), else its
    first three words."""
    cands = re.findall(r"(?<=[a-z,] )([A-Z][a-zA-Z]{2,}(?: [A-Z][a-zA-Z]{2,})?)", doc[:2000])
    return r.choice(cands) if cands else " ".join(doc.split()[:3])


def _topic(doc: str) -> str:
    s = (_sentences(doc) or [doc[:200]])[0].rstrip(".!?")
    return f'the following: "{s}"'


def task_prompts(docs: list[str], n: int, answer: Answer, *, seed: int = 0,
                 excerpt_chars: int = 900) -> list[tuple[str, str]]:
    """``n`` user turns ``(task, text)`` from ``docs``, tasks in equal shares (:data:`TASKS`, round robin),
    documents drawn without replacement (cycled if ``n`` is larger) in a ``seed``-shuffled order.

    Args:
        docs: training documents (plain text); answer: answers stage-1 user turns greedily
            (``answer(turns, max_new_tokens) -> texts``), e.g. the target through
            :func:`specdec.training.eagle3_data.regenerated_sequences`.
        excerpt_chars: longest document excerpt in summarize/rag prompts (~4 characters per token).
    Returns:
        ``[(task, user_turn_text)]`` of length ``n`` (empty if ``docs`` is).
    """
    if not docs or n < 1:
        return []
    r = random.Random(seed)
    order = list(range(len(docs)))
    r.shuffle(order)
    picks = [(TASKS[i % len(TASKS)], docs[order[i % len(order)]]) for i in range(n)]
    german = [i for i, (t, _) in enumerate(picks) if t == "translate"]
    sent = {i: r.choice(_sentences(picks[i][1]) or [picks[i][1][:200]]) for i in german}
    replies = answer([f"Translate English to German: {sent[i]}" for i in german], 48) if german else []
    reply = dict(zip(german, (_first_line(x) for x in replies)))
    out = []
    for i, (task, doc) in enumerate(picks):
        if task == "summarize":
            text = f"Summarize: {_excerpt(doc, excerpt_chars)}"
        elif task == "rag":
            text = f"{_excerpt(doc, excerpt_chars)}\n{r.choice(_RAG).format(x=_name(doc, r))}"
        elif task == "qa":
            text = r.choice(_QA).format(x=_name(doc, r))
        elif task == "translate":
            text = f"Translate German to English: {reply[i] or sent[i]}"
        elif task == "math":
            text = _math_problem(r)
        else:
            text = r.choice(_WRITE).format(t=_topic(doc))
        out.append((task, text))
    return out


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""
