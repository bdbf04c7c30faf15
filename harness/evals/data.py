"""GSM8K-format data: the Hugging Face hub (openai/gsm8k, the default for users) or local
JSONL files with GSM8K's schema, one {"question": str, "answer": str} object a line."""
from __future__ import annotations

import hashlib
from pathlib import Path

from harness.jsonl import records

HUB = "hub"  # --data hub: lm-eval's own dataset_path (openai/gsm8k, config "main")


class DataError(Exception):
    """A missing or malformed data file: one line, exit code 2."""


def read_jsonl(path: str | Path) -> list[dict]:
    """Read and validate a GSM8K-schema JSONL file."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DataError(f"data file {p} does not exist") from None
    except IsADirectoryError:
        raise DataError(f"data file {p} is a directory") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read data file {p}: {getattr(e, 'strerror', None) or e}") from None
    docs = []
    for i, obj in records(lines, p, DataError):
        if not isinstance(obj, dict) or not isinstance(obj.get("question"), str) \
                or not isinstance(obj.get("answer"), str):
            raise DataError(f"{p}:{i}: expected an object with string fields \"question\" and \"answer\" "
                            f"(GSM8K's schema)")
        if "####" not in obj["answer"]:
            raise DataError(f"{p}:{i}: the answer has no final \"#### N\" line (GSM8K's format)")
        docs.append(obj)
    if not docs:
        raise DataError(f"data file {p} holds no questions")
    return docs


def default_train_path(test_path: str | Path) -> Path | None:
    """train.jsonl beside a test.jsonl, for few-shot examples."""
    p = Path(test_path)
    cand = p.with_name("train.jsonl")
    return cand if cand.exists() and cand != p else None


def question_hash(question: str) -> str:
    return hashlib.sha256(question.strip().encode("utf-8")).hexdigest()[:16]


def gold_answer(answer: str) -> str:
    return answer.split("####")[-1].strip().replace(",", "")
