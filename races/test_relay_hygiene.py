"""Every read of a relay entry was preceded by a write for the same request (an entry handed
to a new request is read only after that request's prefill wrote it), and a step writes
exactly its own rows' entries plus entry 0 when it has padded rows (article sections 4.2-4.3)."""
import pytest

from races.scenarios import SCENARIOS, seeds


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_relay_entries(target, tok, oh_options, scenario, record_property):
    for seed in seeds(oh_options):
        reqs, kw, _ = SCENARIOS[scenario](tok, seed)
        run = target.run(reqs, overlap=True, track=("relay.",), **kw)
        owner: dict[int, str] = {}
        problems = []
        for a in run.tracker.log:
            entries = a.meta.get("entries")
            if a.thread != "forward" or entries is None:
                continue
            if a.write:
                expected = set(entries) | ({0} if a.meta.get("padded") else set())
                if set(a.units) != expected:
                    extra = sorted(set(a.units) - expected)
                    missing = sorted(expected - set(a.units))
                    problems.append((a.step, f"step {a.step} ({a.name}) wrote entries {extra or ''} "
                                     f"{'and not ' + str(missing) if missing else ''}: padded rows must use "
                                     f"entry 0, and every row its own entry"))
                for e in a.units:
                    owner[e] = entries.get(e, owner.get(e))
            else:
                for e in a.units:
                    rid = entries.get(e)
                    if rid is not None and owner.get(e) != rid:
                        problems.append((a.step, f"step {a.step} ({a.name}) read relay entry {e} for {rid}, "
                                         f"but it was last written for {owner.get(e) or 'no request'}"))
            if problems:
                break
        if problems:
            record_property("first_step", problems[0][0])
        assert not problems, f"seed {seed}: {problems[0][1]}"
