"""`run --prompts FILE.jsonl`: one request per line, every field checked before anything runs.

A line is {"prompt": str} or {"messages": [{"role": str, "content": str}, ...]} plus optional
"id", "max_tokens", "temperature", "top_p", "repetition_penalty", "seed", "stop", "arrival",
"abort_after", "ignore_eos". A wrong type, an out-of-range value or an unknown field (a typo
would otherwise be ignored silently) is one line naming the file, the line and the field.
"""
from __future__ import annotations

from typing import Callable

from harness.jsonl import read_lines, records
from harness.validate import ABORT_AFTER, ARRIVAL, ParamError, check_sampling, check_value

FIELDS = ("prompt", "messages", "id", "max_tokens", "temperature", "top_p", "repetition_penalty", "seed",
          "stop", "arrival", "abort_after", "ignore_eos")


def _field(name: str) -> str:
    return f'"{name}"'


def check_item(obj, where: str, error: Callable[[str], Exception]) -> dict:
    """The line's object, checked; `error` gets '<file>:<line>: ...'."""
    def bad(msg: str):
        return error(f"{where}: {msg}")
    if not isinstance(obj, dict):
        raise bad('expected an object with "prompt" (string) or "messages"')
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise bad(f"unknown field(s) {', '.join(map(_field, unknown))}; known: {', '.join(FIELDS)}")
    if ("prompt" in obj) == ("messages" in obj):
        raise bad('expected an object with "prompt" (string) or "messages", not both')
    if "prompt" in obj and not isinstance(obj["prompt"], str):
        raise bad('"prompt" must be a string')
    if "messages" in obj:
        m = obj["messages"]
        if not isinstance(m, list) or not m or not all(
                isinstance(x, dict) and isinstance(x.get("role"), str) and isinstance(x.get("content"), str)
                for x in m):
            raise bad('"messages" must be a non-empty list of {"role": string, "content": string}')
    if "id" in obj and (isinstance(obj["id"], bool) or not isinstance(obj["id"], (str, int))):
        raise bad('"id" must be a string or an integer')
    try:
        check_sampling(obj, _field)
        for name, rng in (("arrival", ARRIVAL), ("abort_after", ABORT_AFTER)):
            if obj.get(name) is not None:
                check_value(name, obj[name], rng, _field)
    except ParamError as e:
        raise bad(str(e)) from None
    if not _unicode(obj):
        raise bad("a string holds a lone surrogate escape (\\ud800-\\udfff): not text that can be encoded")
    stop = obj.get("stop")
    if stop is not None and not (isinstance(stop, str) and stop) and not (
            isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise bad('"stop" must be a non-empty string or a list of non-empty strings')
    if not isinstance(obj.get("ignore_eos", False), bool):
        raise bad('"ignore_eos" must be true or false')
    return obj


def _unicode(x) -> bool:
    """Every string inside x encodes as UTF-8 (JSON's "\\ud800" escapes decode to strings that do not)."""
    if isinstance(x, str):
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(x, dict):
        return all(_unicode(k) and _unicode(v) for k, v in x.items())
    if isinstance(x, list):
        return all(_unicode(v) for v in x)
    return True


def read_prompt_file(path: str, error: Callable[[str], Exception]) -> list[dict]:
    items, ids = [], set()
    for i, obj in records(read_lines(path, "--prompts", error), path, error):
        item = check_item(obj, f"{path}:{i}", error)
        if "id" in item:
            rid = str(item["id"])
            if rid in ids:
                raise error(f"{path}:{i}: \"id\" {rid!r} is given twice (ids name requests in the output)")
            ids.add(rid)
        items.append(item)
    return items
