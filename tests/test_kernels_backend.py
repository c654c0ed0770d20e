"""Every clustering backend implements :class:`ClusteringBackend` with its signatures: each op's
parameters, written once in ``fastasr.kernels.clustering.backend``, are the first parameters of
every implementation's function, with the same names, order, kinds and defaults; anything an
implementation adds after them has a default (so a call written against the interface runs on
any backend)."""

from __future__ import annotations

import inspect

import pytest

from fastasr.kernels import dispatch, native
from fastasr.kernels.clustering import ops, reference
from fastasr.kernels.clustering.backend import OPS, ClusteringBackend, ModuleBackend, op_signature


def mismatch(function, op: str) -> str | None:
    """Why ``function`` does not take ``op``'s parameters as the interface writes them, or None."""
    wanted = list(op_signature(op).parameters.values())
    given = list(inspect.signature(function).parameters.values())
    for i, p in enumerate(wanted):
        if i >= len(given):
            return f"lacks {p.name!r}"
        g = given[i]
        if (g.name, g.kind, g.default) != (p.name, p.kind, p.default):
            return (f"parameter {i} is {g.name!r} ({g.kind.description}, default {g.default!r}); "
                    f"the interface has {p.name!r} ({p.kind.description}, default {p.default!r})")
    extra = [g.name for g in given[len(wanted):] if g.default is inspect.Parameter.empty
             and g.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    return f"adds {extra} without defaults" if extra else None


def _implementations(backend) -> dict[str, object]:
    if isinstance(backend, ModuleBackend):
        return {op: getattr(backend, op) for op in OPS if backend.implements(op)}
    return {op: getattr(backend, op) for op in OPS if hasattr(backend, op)}


def test_the_interface_lists_the_ops_the_dispatcher_sends():
    assert set(OPS) == {"hash_codes", "hamming_kmeans", "hash_kmeans", "topk_indices", "clustered_dot",
                        "clustered_weighted_sum", "broadcast_clusters", "cluster_means",
                        "centroid_attention", "improved_sparse", "improved_clustered"}
    for op in OPS:  # each method carries its documentation
        assert getattr(ClusteringBackend, op).__doc__, op
    assert {op for op in dispatch.TRITON_MODULES if op in OPS} <= set(ops.TRITON.modules)
    assert {op for op in dispatch.NATIVE_OPS if op in OPS} == set(ops.NATIVE.modules)


@pytest.mark.parametrize("name", ["ops", "reference", "native"])
def test_each_cpu_backend_conforms(name):
    backend = {"ops": ops, "reference": ops.REFERENCE, "native": ops.NATIVE}[name]
    found = _implementations(backend)
    if name in ("ops", "reference"):
        assert set(found) == set(OPS)  # the dispatcher and the reference implement every op
        assert isinstance({"ops": ops, "reference": reference}[name], ClusteringBackend)
    else:
        assert found.keys() <= {op for op in OPS if hasattr(native, op)}
    problems = {op: why for op, f in found.items() if (why := mismatch(f, op))}
    assert problems == {}


def test_the_triton_backend_conforms():
    pytest.importorskip("triton")
    found = _implementations(ops.TRITON)
    assert set(found) == set(ops.TRITON.modules)
    problems = {op: why for op, f in found.items() if (why := mismatch(f, op))}
    assert problems == {}


def test_a_signature_that_differs_is_caught():
    def renamed(x, planes, lens=None):
        return x

    def reordered(codes, lengths, iterations, clusters, generator=None, *, bits=63):
        return codes

    def other_default(x, planes, lengths=0):
        return x

    def extra_required(scores, k, how):
        return scores

    def extra_optional(scores, k, *, block=64):
        return scores

    assert "'lens'" in mismatch(renamed, "hash_codes")
    assert "'iterations'" in mismatch(reordered, "hamming_kmeans")
    assert "default 0" in mismatch(other_default, "hash_codes")
    assert "without defaults" in mismatch(extra_required, "topk_indices")
    assert mismatch(extra_optional, "topk_indices") is None
