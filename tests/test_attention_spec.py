"""Spec strings, config files, parameter validation and input checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from fastasr.attention import (
    AutoAttention,
    ClusteredAttention,
    FullAttention,
    ImprovedClusteredAttention,
    InnerAttention,
    LSHAttention,
    TopKAttention,
    build_attention,
)

CONF = Path(__file__).resolve().parents[1] / "conf" / "attention"


@pytest.mark.parametrize(
    "spec,cls,canonical,values",
    [
        ("full", FullAttention, "full", {}),
        ("lsh-4", LSHAttention, "lsh-4", {"rounds": 4, "chunk": 32}),
        ("lsh", LSHAttention, "lsh-1", {"rounds": 1}),
        (
            "clustered-100",
            ClusteredAttention,
            "clustered-100",
            {"clusters": 100, "bits": 63, "iterations": 10},
        ),
        (
            "i-clustered-200",
            ImprovedClusteredAttention,
            "i-clustered-200",
            {"clusters": 200, "topk": 32},
        ),
        ("i_clustered-25", ImprovedClusteredAttention, "i-clustered-25", {"clusters": 25}),
        ("topk-7", TopKAttention, "topk-7", {"k": 7}),
        ("oracle-top", TopKAttention, "topk-32", {"k": 32}),
        (" Oracle_Top ", TopKAttention, "topk-32", {"k": 32}),
    ],
)
def test_spec_strings(spec, cls, canonical, values):
    attn = build_attention(spec)
    assert type(attn) is cls
    assert attn.spec == canonical
    for key, value in values.items():
        assert attn.hparams[key] == value == getattr(attn, key)
    assert list(attn.parameters()) == [] and attn.state_dict() == {}
    assert build_attention(attn.spec).hparams == attn.hparams


def test_keyword_overrides_and_precedence():
    attn = build_attention("i-clustered-100", topk=64, bits=32)
    assert attn.hparams == {"clusters": 100, "bits": 32, "iterations": 10, "seed": None, "topk": 64}
    assert build_attention("clustered-100", clusters=7).spec == "clustered-7"
    cfg = {"name": "i-clustered-100", "clusters": 50, "topk": 8}
    assert build_attention(cfg, topk=16).hparams["clusters"] == 50
    assert build_attention(cfg, topk=16).hparams["topk"] == 16
    rebuilt = build_attention(attn, seed=3)
    assert rebuilt is not attn and rebuilt.hparams == {**attn.hparams, "seed": 3}
    assert build_attention(attn) is attn


def test_lsh_needs_shared_qk_flag():
    assert build_attention("lsh-1").requires_shared_qk
    assert not any(
        build_attention(s).requires_shared_qk
        for s in ["full", "clustered-3", "i-clustered-3", "topk-2"]
    )


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.name)
def test_config_files_build_and_hold_only_their_own_parameters(path):
    cfg = OmegaConf.load(path)
    attn = build_attention(cfg)
    own = {p.name for p in type(attn).params}
    keys = set(cfg) - {"name"}
    assert keys <= own, f"{path.name}: {keys - own} are not parameters of {attn.name}"
    assert "_target_" not in cfg
    for line in path.read_text().splitlines():
        if re.match(r"^\w+:", line) and not line.startswith("name:"):
            assert "#" in line, f"{path.name}: parameter line without a comment: {line!r}"


def test_config_files_cover_every_variant():
    names = {OmegaConf.load(p).name for p in CONF.glob("*.yaml")}
    assert names == {"full", "lsh", "clustered", "i-clustered", "topk", "oracle-top", "auto"}
    assert build_attention(OmegaConf.load(CONF / "oracle_top.yaml")).spec == "topk-32"
    assert build_attention(OmegaConf.load(CONF / "i_clustered.yaml")).spec == "i-clustered-100"


@pytest.mark.parametrize(
    "spec,overrides,pattern",
    [
        (
            "clustred-100",
            {},
            r"unknown attention spec 'clustred-100'; expected one of: .*i-clustered-<clusters>",
        ),
        ("full-3", {}, r"'full' takes no number"),
        ("", {}, r"unknown attention spec"),
        (
            "clustered-100",
            {"bits": 64},
            r"'clustered': bits=64 is out of range; expected an integer in \[1, 63\]",
        ),
        ("clustered-0", {}, r"clusters=0 is out of range; expected an integer >= 1"),
        ("i-clustered-10", {"topk": 0}, r"topk=0 is out of range"),
        ("clustered-10", {"iterations": -1}, r"iterations=-1"),
        ("topk-0", {}, r"'topk': k=0 is out of range"),
        ("lsh-0", {}, r"rounds=0"),
        ("lsh-1", {"buckets": 7}, r"buckets=7 is odd; expected an even integer >= 2"),
        (
            "clustered-10",
            {"topk": 5},
            r"'clustered': unknown parameter 'topk'; accepted parameters: bits, clusters, iterations, seed",
        ),
        ("full", {"seed": 1}, r"'full': unknown parameter 'seed'; accepted parameters: dense_from, pack_from, varlen_from"),
        ("topk-3", {"k": 2.5}, r"k=2.5 \(float\); expected an integer >= 1"),
        ("topk-3", {"k": "4"}, r"k='4' \(str\)"),
        ("clustered-3", {"bits": True}, r"bits=True \(bool\)"),
        ("clustered-3", {"clusters": None}, r"clusters=None; expected an integer >= 1"),
    ],
)
def test_invalid_specs_raise_value_errors_that_say_what_is_expected(spec, overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        build_attention(spec, **overrides)


def test_mapping_errors():
    with pytest.raises(ValueError, match="has no 'name'"):
        build_attention({"clusters": 3})
    with pytest.raises(ValueError, match="unknown parameter 'clusterz'"):
        build_attention(OmegaConf.create({"name": "clustered", "clusterz": 3}))
    with pytest.raises(ValueError, match="expected a string"):
        build_attention({"name": 3})


def test_input_checks():
    attn = build_attention("full")
    q = torch.zeros(2, 1, 5, 4)
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 5\]"):
        attn(q, q, q, torch.tensor([6, 2]))
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 5\]"):
        attn(q, q, q, torch.tensor([-1, 2]))
    with pytest.raises(ValueError, match=r"lengths must have shape \(2,\)"):
        attn(q, q, q, torch.tensor([5]))
    with pytest.raises(ValueError, match="integer tensor"):
        attn(q, q, q, torch.tensor([5.0, 2.0]))
    with pytest.raises(ValueError, match=r"q must be \(B, H, N, E\)"):
        attn(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="q and k shapes differ"):
        attn(q, q[:, :, :4], q)
    with pytest.raises(ValueError, match="dtypes differ"):
        attn(q, q, q.double())
    out = attn(q, q, q, [5, 2])  # a list of ints is accepted
    assert out.shape == q.shape


def test_lsh_rejects_distinct_q_and_k_with_a_clear_message():
    attn = build_attention("lsh-1")
    x = torch.randn(1, 1, 6, 4)
    with pytest.raises(ValueError, match=r"lsh-1 needs shared queries and keys.*shared_qk=true"):
        attn(x, x.clone(), x)
    with pytest.raises(ValueError, match="shared queries and keys"):
        attn.dense_weights(x, x.clone())
    # the same storage seen through two identical views is shared
    base = torch.randn(1, 6, 1, 4)
    a, b = base.transpose(1, 2), base.transpose(1, 2)
    assert a is not b
    assert attn(a, b, x).shape == x.shape
    # ...but not a view of a different part of it
    with pytest.raises(ValueError):
        attn(x[:, :, 1:], x[:, :, :-1], x[:, :, 1:])


def test_every_variant_is_an_inner_attention():
    for spec in ["full", "lsh-1", "clustered-3", "i-clustered-3", "topk-2", "oracle-top"]:
        assert isinstance(build_attention(spec), InnerAttention)


def test_length_cost_says_which_variants_are_quadratic():
    from fastasr.attention import length_cost

    assert [length_cost(s) for s in ("full", "topk-8", "oracle-top")] == ["quadratic"] * 3
    assert [length_cost(s) for s in ("clustered-100", "i_clustered", "lsh-4", None)] == ["linear"] * 4
    assert length_cost({"name": "full"}) == "quadratic"
    assert length_cost(build_attention("i-clustered-5")) == "linear"
    with pytest.raises(ValueError, match="unknown attention spec"):
        length_cost("dense")


# Every exported variant, with the numbers it is built with directly (its spec number only).
DIRECT = {
    FullAttention: [None],
    LSHAttention: [1, 4],
    ClusteredAttention: [100, 5],
    ImprovedClusteredAttention: [100, 5],
    TopKAttention: [32, 5],
    AutoAttention: [1024, 8],  # 8: a call of N = 37 takes the i-clustered branch
}


def test_direct_construction_covers_every_exported_variant():
    import fastasr.attention as attention

    exported = {
        obj
        for obj in (getattr(attention, name) for name in attention.__all__)
        if isinstance(obj, type) and issubclass(obj, InnerAttention) and obj is not InnerAttention
    }
    assert exported == set(DIRECT)


@pytest.mark.parametrize(
    "cls,number",
    [(cls, n) for cls, numbers in DIRECT.items() for n in numbers],
    ids=lambda x: x.__name__ if isinstance(x, type) else str(x),
)
def test_every_exported_class_constructs_and_runs_on_its_own(cls, number):
    attn = cls() if number is None else cls(number)
    built = build_attention(cls.name if number is None else f"{cls.name}-{number}")
    # the same module as the registry builds: same class, parameters, canonical spec
    assert type(built) is cls and attn.hparams == built.hparams and attn.spec == built.spec
    assert list(attn.hparams.items()) == list(built.hparams.items())  # same order too
    assert list(attn.parameters()) == [] and attn.state_dict() == {}

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 37, 8, generator=g) for _ in range(3))
    if cls.requires_shared_qk:
        k = q
    lengths = torch.tensor([37, 20])
    torch.manual_seed(0)  # the random variants draw from torch's global RNG (no seed)
    out = attn(q, k, v, lengths)
    assert out.shape == (2, 2, 37, 8) and out.dtype == v.dtype
    assert torch.isfinite(out).all()
    assert (out[1, :, 20:] == 0).all()  # padded queries
    torch.manual_seed(0)
    assert torch.equal(out, built(q, k, v, lengths))


@pytest.mark.parametrize("cls", list(DIRECT), ids=lambda c: c.__name__)
def test_defaults_live_in_the_constructor(cls):
    assert set(cls.defaults()) == {p.name for p in cls.params}
    assert cls().hparams == cls.defaults() == build_attention(cls.name).hparams


def test_paper_defaults():
    assert ClusteredAttention.defaults() == {
        "clusters": 100,
        "bits": 63,
        "iterations": 10,
        "seed": None,
    }
    assert ImprovedClusteredAttention.defaults()["topk"] == 32
    assert TopKAttention.defaults() == {"k": 32, "chunk": 1024}
    assert LSHAttention.defaults() == {"rounds": 1, "chunk": 32, "buckets": 32, "seed": None}
    auto = AutoAttention.defaults()
    assert {k: auto[k] for k in ImprovedClusteredAttention.defaults()} == (
        ImprovedClusteredAttention.defaults()
    )


def test_direct_construction_checks_values_like_the_registry():
    with pytest.raises(
        ValueError, match=r"'clustered': bits=64 is out of range; expected an integer in \[1, 63\]"
    ):
        ClusteredAttention(100, bits=64)
    with pytest.raises(ValueError, match=r"'i-clustered': topk=0 is out of range"):
        ImprovedClusteredAttention(topk=0)
    with pytest.raises(ValueError, match=r"'auto': topk=0 is out of range"):
        AutoAttention(topk=0)
    with pytest.raises(ValueError, match=r"buckets=7 is odd"):
        LSHAttention(buckets=7)
    with pytest.raises(ValueError, match=r"k=2.5 \(float\)"):
        TopKAttention(2.5)
    with pytest.raises(TypeError, match="topk"):
        ClusteredAttention(100, topk=5)
    # a numpy-style integral value is stored as an int
    assert type(TopKAttention(torch.tensor(7).item()).k) is int


def test_register_rejects_a_constructor_that_does_not_match_its_params():
    from fastasr.attention.registry import available, register
    from fastasr.attention.spec import Param

    class Bad(InnerAttention):
        name = "bad-variant"
        number_param = "n"
        params = (Param("n", low=1), Param("m", low=1))

        def __init__(self, n: int = 1) -> None:
            super().__init__()
            self._set_hparams(n=n)

    with pytest.raises(ValueError, match=r"constructor arguments \['n'\] != params \['m', 'n'\]"):
        register(Bad)
    assert "bad-variant" not in available()
