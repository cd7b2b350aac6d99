"""analysis.labels: a reason's subject said once for many workers or endpoints."""
from epdbench.analysis.labels import named_or_counted


def test_many_alike_are_counted_per_pod_a_few_are_named():
    assert named_or_counted([("decode-0", "thread 1")], "worker") == "decode-0 thread 1"
    assert named_or_counted([("d", "a"), ("p", "b")], "endpoint") == "2 endpoints (d a; p b)"
    many = [("decode-0", f"thread {i}") for i in range(6)] + [("prefill-0", f"thread {i}") for i in range(4)]
    assert named_or_counted(many, "endpoint") == "10 endpoints (decode-0: 6, prefill-0: 4)"
