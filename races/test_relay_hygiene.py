"""Every read of a relay entry was preceded by a write for the same request (an entry handed
to a new request is read only after that request's prefill wrote it), and a step writes
exactly its own rows' entries plus entry 0 when it has padded rows, and no live request owns
entry 0 or slot-table row 0 (article sections 4.2-4.3)."""
import pytest

from races.scenarios import SCENARIOS, seeds


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_relay_entries(target, tok, oh_options, scenario, record_property):
    for seed in seeds(oh_options):
        reqs, kw, _ = SCENARIOS[scenario](tok, seed)
        run = target.run(reqs, overlap=True, track=("relay.",), **kw)
        owner: dict[tuple, str] = {}
        problems = []
        bufs = run.engine.dev.buffers
        for a in run.tracker.log:
            t = bufs[a.buffer]
            width = t[0].numel() if t.dim() > 1 else 1  # the log counts elements: back to entries
            units = sorted({u // width for u in a.units})
            entries = a.meta.get("entries")
            if a.thread != "forward" or entries is None:
                continue
            # entry 0 (and slot-table row 0) belongs to no request: padded rows write it
            zero = [f"relay entry 0 ({entries[0]})"] if 0 in entries else []
            zero += [f"slot-table row 0 ({a.meta['rows'][0]})"] if 0 in a.meta.get("rows", {}) else []
            if zero:
                problems.append((a.step, f"step {a.step} ({a.name}): a live request owns {' and '.join(zero)}, "
                                 f"but entry 0 and row 0 belong to no request (padded rows write them)"))
                break
            if a.write:
                expected = set(entries) | ({0} if a.meta.get("padded") else set())
                if set(units) != expected:
                    extra = sorted(set(units) - expected)
                    missing = sorted(expected - set(units))
                    problems.append((a.step, f"step {a.step} ({a.name}) wrote entries {extra or ''} "
                                     f"{'and not ' + str(missing) if missing else ''}: padded rows must use "
                                     f"entry 0, and every row its own entry"))
                for e in units:
                    owner[a.buffer, e] = entries.get(e, owner.get((a.buffer, e)))
            else:
                for e in units:
                    rid = entries.get(e)
                    if rid is not None and owner.get((a.buffer, e)) != rid:
                        problems.append((a.step, f"step {a.step} ({a.name}) read {a.buffer} entry {e} for {rid}, "
                                         f"but it was last written for {owner.get((a.buffer, e)) or 'no request'}"))
            if problems:
                break
        if problems:
            record_property("first_step", problems[0][0])
        assert not problems, f"seed {seed}: {problems[0][1]}"
