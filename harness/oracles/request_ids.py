"""Client-set request ids (issue 36, item 2): each client gets its own request's answer, and one
client's disconnect ends only its own request, even when two live requests carry the same id.

What vLLM 0.32 does with them (read in vllm/entrypoints/serve/engine/serving.py,
vllm/v1/engine/input_processor.py, output_processor.py and async_llm.py): the id of a request is
the `X-Request-Id` header when present, else the body's `request_id`, prefixed `cmpl-` (chat:
`chatcmpl-`) and returned as the response's `id`; the engine's own id is that plus 8 random
characters (`assign_request_id`), so two live requests with one client id are two requests inside.
The output processor maps the client id to every internal id: an abort by the client id ends all of
them, an abort by the internal id only its own, and a client's disconnect aborts by the internal
id. So a bug that keys, routes or aborts by the client id shows as a crossed answer or as the
other request cut short, in both arms alike (the token oracles, which compare the arms, would see
nothing): this oracle is absolute, per arm, over the requests that carry a client id.

- a response's `id` carries the client's id in one arm exactly when it does in the other (a
  release that ignores the body's field ignores it in both);
- a request of a duplicate group (two or more requests sent together with one id) that must run
  to its length (EOS ignored, nothing that stops it: no stop string or id, no min_tokens, no
  grammar, n 1) returns exactly max_tokens ids, finish `length`, whatever the others of its group
  did (one of them may disconnect after a few tokens);
- its usage counts its own prompt (the group's prompts differ in length, their max_tokens too): a
  count that is another member's is an answer crossed between the clients.
"""
from __future__ import annotations

from harness.targets.served.chat_turns import HEADER_KEY

DUPLICATE_MARK = "-dup-"  # in a duplicate group's client id (served_chat draws them): the summary counts them


def client_id(r) -> str | None:
    """The id a request's client set (the header wins over the body, as vLLM reads them)."""
    ex = getattr(r, "extra", None) or {}
    got = ex.get(HEADER_KEY, ex.get("request_id"))
    return None if got is None else str(got)


def runs_to_length(r) -> bool:
    """Nothing but max_tokens can end this request (its answer's length is known)."""
    ex = getattr(r, "extra", None) or {}
    return (bool(getattr(r, "ignore_eos", False)) and not r.stop and getattr(r, "n", 1) == 1 and not ex.get("chat")
            and not {"stop_token_ids", "min_tokens", "structured_outputs"} & set(ex))


def groups(reqs) -> dict[str, list]:
    """client id -> the requests that carry it (a group of two or more is a duplicate)."""
    out: dict[str, list] = {}
    for r in reqs:
        cid = client_id(r)
        if cid is not None:
            out.setdefault(cid, []).append(r)
    return out


def findings(reqs, off, on, server_aborted=None) -> dict[str, list[str]]:
    """rid -> what is wrong with the answer its client got; `server_aborted`: rids the server ended
    on purpose (/pause?mode=abort: harness.oracles.pause_abort), whose cut is no fault."""
    out: dict[str, list[str]] = {}
    runs = {"off": off, "on": on}
    outs = {lab: {rid: (list(i), f) for rid, i, f in run.outputs} for lab, run in runs.items()}
    surf = {lab: getattr(run, "surface", {}) or {} for lab, run in runs.items()}
    for cid, group in groups(reqs).items():
        for r in group:
            if r.abort_after is not None or r.rid in (server_aborted or ()):
                continue  # its client left, or a pause aborted it: its answer is cut on purpose
            carries = {lab: cid in str((surf[lab].get(r.rid) or {}).get("id") or "") for lab in runs
                       if r.rid in surf[lab]}
            if len(carries) == 2 and carries["on"] != carries["off"]:
                out.setdefault(r.rid, []).append(
                    f"response id carries the client's id {cid!r} async {'on' if carries['on'] else 'off'} only")
            if len(group) < 2 or not runs_to_length(r):
                continue
            others = ", ".join(f"{q.rid}" + (f" (disconnected after {q.abort_after})" if q.abort_after else "")
                               for q in group if q is not r)
            for lab in runs:
                if r.rid not in outs[lab]:
                    continue
                ids, fin = outs[lab][r.rid]
                if fin != "length" or len(ids) != r.max_new_tokens:
                    out.setdefault(r.rid, []).append(
                        f"async {lab}: client id {cid!r} shared with {others}: ended {fin} after {len(ids)} of "
                        f"{r.max_new_tokens} ids (nothing but max_tokens may end it)")
                got = ((surf[lab].get(r.rid) or {}).get("usage") or {}).get("prompt_tokens")
                theirs = [q.rid for q in group if q is not r and len(q.prompt_ids) == got != len(r.prompt_ids)]
                if theirs:
                    out.setdefault(r.rid, []).append(
                        f"async {lab}: client id {cid!r}: usage.prompt_tokens {got} is {theirs[0]}'s prompt, not "
                        f"its own {len(r.prompt_ids)} (an answer crossed between clients)")
    return out


def counts(reqs) -> dict:
    """How many requests carried a client id, by how they sent it, and the duplicate groups."""
    g = groups(reqs)
    ex = [getattr(r, "extra", None) or {} for r in reqs]
    return {"body": sum(1 for e in ex if "request_id" in e and HEADER_KEY not in e),
            "header": sum(1 for e in ex if HEADER_KEY in e),
            "duplicate_groups": sum(1 for v in g.values() if len(v) > 1),
            "duplicate_aborts": sum(1 for v in g.values() if len(v) > 1 for r in v if r.abort_after is not None)}
