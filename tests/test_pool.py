"KV pool: long property runs (bookkeeping through `KVPool`, with real pages), the seed's capacity example, bad input."
import hashlib, random
from array import array
import pytest, torch
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from hqkv.pool import KVPool, PageAllocator, PoolFull
from hqkv.sizing import Geometry, lanes_bytes

TINY = Geometry("tiny-test", layers=2, attn_layers=2, kv_heads=2, head_dim=64)  # bf16 rows of 128 bytes

def _row(prefix, layer, kv, heads=2, nbytes=128) -> torch.Tensor:
    "The bytes a position's K (kv=0) or V (kv=1) row holds in this model of the engine: a function of the whole token prefix."
    seed = array("Q", prefix).tobytes() + bytes([layer, kv])
    out = b"".join(hashlib.blake2b(seed + bytes([h, i]), digest_size=64).digest() for h in range(heads) for i in range(nbytes // 64))
    return torch.frombuffer(bytearray(out), dtype=torch.uint8).view(heads, nbytes)

def _unchanged(pool, f, exc, contains):
    snap, data = pool.snapshot(), pool.kv.clone()
    with pytest.raises(exc, match=contains): f()
    assert pool.snapshot() == snap and torch.equal(pool.kv, data)

class PoolMachine(RuleBasedStateMachine):
    "Random interleavings of admit / append / write / share / finish / cancel / evict on a `KVPool` with real pages."
    @initialize(pool_tokens=st.integers(2, 40), pt=st.sampled_from([1, 2, 4]),
                docs=st.lists(st.lists(st.integers(0, 2), min_size=16, max_size=16), min_size=1, max_size=3))
    def setup(self, pool_tokens, pt, docs):
        num_pages = max(1, pool_tokens // pt)
        self.pool = KVPool(TINY, "bf16", f"{num_pages * pt}tok", page_tokens=pt)
        assert self.pool.num_pages == num_pages
        self.pt, self.N, self.docs = pt, num_pages, docs
        self.toks, self.pending, self.next_id = {}, {}, 0

    def _active(self): return sorted(self.pool.alloc.seq_ids)

    def _write(self, sid):
        "What the engine does after `append`: write the rows of the positions it handed out."
        start, n = self.pending.pop(sid, (0, 0))
        if not n: return
        t = self.toks[sid]
        for layer in range(TINY.attn_layers):
            k = torch.stack([_row(t[:p + 1], layer, 0) for p in range(start, start + n)])
            v = torch.stack([_row(t[:p + 1], layer, 1) for p in range(start, start + n)])
            self.pool.write(sid, layer, start, k, v)
        for slot in self.pool.alloc.slots(sid, start, n): assert self.pool.alloc.refcount(slot // self.pt) == 1

    @rule(data=st.data(), odd=st.integers(0, 9))
    def admit(self, data, odd):
        pool, pt, cap = self.pool, self.pt, self.N * self.pt
        doc = data.draw(st.sampled_from(self.docs))
        prompt = (doc[:data.draw(st.integers(0, len(doc)))] + data.draw(st.lists(st.integers(0, 2), max_size=3)))[:cap] or [1]
        max_new = data.draw(st.integers(0, max(0, min(6, cap - len(prompt))))) + (cap if odd == 1 else 0)   # now and then: a bound that never fits
        if odd == 0 and len(pool.alloc):   # now and then: an id already admitted
            return _unchanged(pool, lambda: pool.admit(self._active()[0], prompt, max_new), ValueError, "already admitted")
        sid = self.next_id; self.next_id += 1
        bound_pages = -(-(len(prompt) + max_new) // pt)
        if bound_pages > self.N:
            return _unchanged(pool, lambda: pool.admit(sid, prompt, max_new), ValueError, f"needs {bound_pages} pages")
        a = pool.alloc
        must_fit = bound_pages <= a.free_pages + a.retained_pages - a.reserved_pages   # retained pages never block
        expect_reuse = pool.lookup(prompt)
        try: adm = pool.admit(sid, prompt, max_new)
        except PoolFull as e:
            assert not must_fit and e.needed > e.available
            return
        assert adm.reused_tokens == expect_reuse and adm.reused_tokens < len(prompt)
        self.toks[sid] = list(prompt)
        if adm.reused_tokens:   # the shared pages hold exactly this prompt's KV, in every layer
            for layer in range(TINY.attn_layers):
                k, v = pool.read(sid, layer)
                for p in range(adm.reused_tokens):
                    assert torch.equal(k[p], _row(prompt[:p + 1], layer, 0)) and torch.equal(v[p], _row(prompt[:p + 1], layer, 1))

    @precondition(lambda self: len(self.pool.alloc))
    @rule(data=st.data(), give_ids=st.booleans(), over=st.integers(0, 5))
    def append(self, data, give_ids, over):
        pool = self.pool
        sid = data.draw(st.sampled_from(self._active()))
        self._write(sid)
        room = pool.alloc.bound(sid) - pool.length(sid)
        if over == 0: return _unchanged(pool, lambda: pool.append(sid, room + data.draw(st.integers(1, 3))), ValueError, "exceeds its reservation")
        n = data.draw(st.integers(0, room))
        start, t = pool.length(sid), self.toks[sid]
        k = max(0, start + n - len(t))
        t.extend(data.draw(st.lists(st.integers(0, 2), min_size=k, max_size=k)))
        assert pool.append(sid, n, token_ids=t[start:start + n] if give_ids else None) == start   # never fails inside the bound
        self.pending[sid] = (start, n)

    @precondition(lambda self: len(self.pool.alloc))
    @rule(data=st.data())
    def write_pending(self, data): self._write(data.draw(st.sampled_from(self._active())))

    @precondition(lambda self: len(self.pool.alloc))
    @rule(data=st.data())
    def write_anywhere(self, data):
        "A write below the writable range (shared or sealed pages) raises and keeps the bytes; what is writable has one holder."
        pool = self.pool
        sid = data.draw(st.sampled_from(self._active()))
        if not pool.length(sid): return
        pos = data.draw(st.integers(0, pool.length(sid) - 1))
        rows = torch.zeros(1, 2, 128, dtype=torch.uint8)
        try: pool.alloc.check_writable(sid, pos, 1)
        except ValueError: return _unchanged(pool, lambda: pool.write(sid, 0, pos, rows, rows), ValueError, "must not be written")
        assert pool.alloc.refcount(pool.alloc.slots(sid, pos, 1)[0] // self.pt) == 1

    @precondition(lambda self: len(self.pool.alloc))
    @rule(data=st.data(), cancel=st.booleans(), unknown=st.integers(0, 4))
    def release(self, data, cancel, unknown):
        if unknown == 0:  # now and then: releasing an unknown id raises and changes nothing
            return _unchanged(self.pool, lambda: (self.pool.cancel if cancel else self.pool.finish)("nobody"), ValueError, "unknown sequence id")
        sid = data.draw(st.sampled_from(self._active()))
        if cancel: self.pool.cancel(sid)                 # maybe half written: its unsealed pages must never be shared
        else: self._write(sid); self.pool.finish(sid)
        self.pending.pop(sid, None); del self.toks[sid]

    @rule(n=st.one_of(st.none(), st.integers(0, 4)))
    def evict(self, n):
        before = self.pool.alloc.retained_pages
        assert self.pool.evict(n) == (before if n is None else min(n, before))

    @precondition(lambda self: len(self.pool.alloc))
    @rule()
    def page_table_matches(self):
        ids = self._active()
        t = self.pool.page_table(ids)
        for b, sid in enumerate(ids):
            pages, L = self.pool.alloc.pages(sid), self.pool.length(sid)
            assert t.indices[t.indptr[b]:t.indptr[b + 1]].tolist() == pages and int(t.seq_lens[b]) == L
            assert (int(t.last_page_len[b]) == L - (len(pages) - 1) * self.pt) if pages else int(t.last_page_len[b]) == 0

    @invariant()
    def integrity(self):
        if hasattr(self, "pool"):
            assert self.pool.check_integrity()
            m = self.pool.metrics()
            assert m["hqkv_kv_pool_used_pages"] + m["hqkv_kv_pool_free_pages"] + m["hqkv_kv_pool_retained_pages"] == m["hqkv_kv_pool_pages"]

PoolMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None, database=None,
                                         suppress_health_check=list(HealthCheck))
test_pool_machine = PoolMachine.TestCase


def test_seed_capacity_example():
    "27B geometry, hq-e8-2b: a budget for 8 x 40,960 tokens admits eight such requests and makes the ninth wait; bf16 holds 7.11x fewer tokens."
    budget = lanes_bytes("qwen3.5-27b", "hq-e8-2b", lanes=8, context=40_960)
    assert budget == 8 * 40_960 * 9_216
    pool = KVPool("qwen3.5-27b", "hq-e8-2b", budget, device="meta")
    assert (pool.num_pages, pool.page_bytes) == (5_120, 64 * 9_216)
    rng = random.Random(0)
    prompts = [[rng.randrange(150_000) for _ in range(4_096)] for _ in range(9)]
    for i in range(8): assert pool.admit(i, prompts[i], 40_960 - 4_096).reserved_pages == 640
    with pytest.raises(PoolFull, match="needs 640 pages, 0 of 5120"): pool.admit(8, prompts[8], 40_960 - 4_096)
    assert pool.try_admit(8, prompts[8], 40_960 - 4_096) is None
    for i in range(8): pool.append(i, 40_960)
    with pytest.raises(ValueError, match="exceeds its reservation"): pool.append(0, 1)
    pool.cancel(5)
    assert pool.admit(8, prompts[8], 40_960 - 4_096).reserved_pages == 640
    assert pool.check_integrity()
    bf16 = KVPool("qwen3.5-27b", "bf16", budget, device="meta")
    assert bf16.plan.bytes_per_token == 65_536 and bf16.num_pages == 720
    assert round(pool.plan.tokens / bf16.plan.tokens, 2) == 7.11
    assert pool.plan_line() == ("hqkv.runtime.vram_plan kv_format=hq-e8-2b page_bytes=589824 kv_pool_pages=5120 "
                                "kv_pool_tokens=327680 kv_pool_bytes=3019898880")


@pytest.mark.parametrize("args, exc, frag", [
    (("gemma-3-270m", "bf16", 0), ValueError, "budget must be positive"),
    (("gemma-3-270m", "bf16", -1), ValueError, "budget must be positive"),
    (("gemma-3-270m", "bf16", "0tok"), ValueError, "budget must be positive"),
    (("gemma-3-270m", "bf16", 196_607), ValueError, "smaller than one page"),
    (("gemma-3-270m", "no-such-format", "1Mi"), ValueError, "unknown KV format"),
    (("no-such-model", "bf16", "1Mi"), ValueError, "unknown model geometry"),
])
def test_bad_construction(args, exc, frag):
    with pytest.raises(exc, match=frag): KVPool(*args)


def test_bad_calls_leave_the_pool_unchanged():
    pool = KVPool("gemma-3-270m", "bf16", "2048tok")
    pool.admit("a", list(range(200)), 50); pool.append("a", 200)
    for l in range(3): pool.write_kv("a", l, 0, torch.randn(200, 1, 256), torch.randn(200, 1, 256))
    pool.append("a", 1); pool.finish("a"); pool.admit("b", list(range(150)), 5)
    rows = torch.zeros(1, 1, 512, dtype=torch.uint8)
    for f, exc, frag in [
        (lambda: pool.admit("b", [1], 1), ValueError, "already admitted"),
        (lambda: pool.finish("zz"), ValueError, "unknown sequence id"),
        (lambda: pool.cancel("zz"), ValueError, "unknown sequence id"),
        (lambda: pool.admit("c", [1] * 2048, 1), ValueError, "can never be admitted"),
        (lambda: pool.admit("c", [], 1), ValueError, "prompt_ids is empty"),
        (lambda: pool.admit("c", ["x"], 1), TypeError, "token ids must be ints"),
        (lambda: pool.admit("c", [-3], 1), ValueError, "token ids must be ints in"),
        (lambda: pool.admit("c", [1], -1), ValueError, "max_new_tokens must be >= 0"),
        (lambda: pool.append("b", 100), ValueError, "exceeds its reservation"),
        (lambda: pool.write("b", 0, 0, rows, rows), ValueError, "shared prefix pages"),
        (lambda: pool.write("b", 0, 128, rows.float(), rows), ValueError, "k_rows must be uint8"),
        (lambda: pool.page_table(["b", "zz"]), ValueError, "unknown sequence id"),
        (lambda: pool.evict(-1), ValueError, "n_pages must be >= 0"),
    ]:
        _unchanged(pool, f, exc, frag)
    assert pool.check_integrity()


def test_prometheus_text_matches_metrics():
    from prometheus_client.parser import text_string_to_metric_families
    pool = KVPool("gemma-3-270m", "bf16", "2048tok")
    pool.admit("a", list(range(300)), 10); pool.append("a", 300); pool.finish("a")
    pool.admit("b", list(range(300)), 10); pool.evict()
    m = pool.metrics()
    seen = {s.name: s.value for fam in text_string_to_metric_families(pool.prometheus_text()) for s in fam.samples}
    for name, value in m.items(): assert seen[name] == value, name
    for name in ("hqkv_kv_pool_pages", "hqkv_kv_pool_used_pages", "hqkv_kv_page_bytes", "hqkv_kv_pool_reserved_pages",
                 "hqkv_kv_pool_retained_pages", "hqkv_kv_prefix_reused_tokens_total", "hqkv_kv_pool_evictions_total"):
        assert name in m
    assert m["hqkv_kv_prefix_reused_tokens_total"] == 256 and m["hqkv_kv_pool_used_pages"] == 4


def test_prefix_keys_depend_on_format_and_geometry():
    "Identical token ids in another format (or model, or page size) never match: the salt enters every key."
    a = PageAllocator(8, 4, b"fmt-a"); b = PageAllocator(8, 4, b"fmt-b")
    for x in (a, b): x.admit(0, list(range(9)), 0); x.append(0, 9); x.finish(0)
    assert a._index.keys().isdisjoint(b._index.keys()) and a.lookup(list(range(9))) == 8
    p1 = KVPool("gemma-3-270m", "bf16", "1024tok"); p2 = KVPool("gemma-3-270m", "q8_0", "1024tok")
    assert p1.alloc.salt != p2.alloc.salt and b"bf16" in p1.alloc.salt
