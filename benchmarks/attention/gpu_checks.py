"""Correctness checks that attention/gpu_table.py runs before it times anything.

The Triton ops against the PyTorch reference on the benchmark's device and sizes, and the
padding-free full attention against SDPA with a key mask. Any failure raises
:class:`CheckFailed`; attention/gpu_table.py then exits with status 1 without timing.
"""

from __future__ import annotations

from unittest import mock


class MaskedSDPA:
    """Full attention through SDPA with a key-padding mask (``fastasr.attention.full``'s
    ``mask`` path, forced), the baseline the other padded paths are timed against."""

    requires_shared_qk = False

    def __call__(self, q, k, v, lengths):
        from fastasr.attention.full import masked_attention

        return masked_attention(q, k, v, lengths)


#: The largest N at which the full-attention paths are checked here. At N = 4,096 (16 sequences)
#: and at 65,536 an fp32 path's backward asked for a 44 GiB buffer and ran out of memory on an
#: 80 GB H100 (it fits an H200); ``attention/full_paths.py`` checks every path at N = 1,024 before timing.
PACKED_CHECK_MAX_N = 2048


class CheckFailed(RuntimeError):
    pass


def _rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def check_kernels(args, device, log) -> list[str]:
    """Triton ops vs the reference at benchmark sizes; raises CheckFailed on any mismatch."""
    import torch

    from fastasr.kernels.clustering import (
        ops,
        reference,
        triton_clustered,
        triton_hashing,
        triton_kmeans,
    )

    lines = []
    check_ns = sorted({n for n in (4096, max(args.ns)) if n in args.ns} or {max(args.ns)})
    C, K = (4, 8) if args.quick else (100, 32)
    g = torch.Generator(device=device).manual_seed(1234)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g, device=device).to(dtype)

    for (H, E) in args.heads:
        for N in check_ns:
            B = max(1, args.tokens // N)
            tag = f"H={H} E={E} N={N} B={B}"
            x = randn(B, H, N, E)
            if ops.kernel_backend(x, "clustered_dot") != "triton":
                raise CheckFailed(f"{tag}: fastasr.kernels.clustering.ops does not route {device} tensors to Triton")
            lengths = torch.full((B,), N, dtype=torch.int64, device=device)
            lengths[-1] = max(1, N - 17 - N // 7)  # one padded sequence
            planes = randn(E + 1, 63)
            codes_ref = reference.hash_codes(x, planes, lengths)
            codes = triton_hashing.hash_codes(x, planes, lengths)
            differ = int((codes != codes_ref).sum())
            if differ > max(1, 1e-5 * codes.numel()):
                raise CheckFailed(f"{tag}: {differ} of {codes.numel()} hash codes differ from the reference")
            a_ref, c_ref = reference.hamming_kmeans(codes_ref, lengths, C, 10)
            a, c = triton_kmeans.hamming_kmeans(codes_ref, lengths, C, 10)
            if not (torch.equal(a, a_ref) and torch.equal(c, c_ref)):
                bad = int((a != a_ref).sum())
                raise CheckFailed(f"{tag}: K-means differs from the reference ({bad} assignments)")
            # the hash inside K-means' one launch (a switch): the hash kernel's codes, so the same clusters
            with mock.patch.object(triton_kmeans, "HASH_IN_KMEANS", True):
                fused = triton_kmeans.hash_kmeans(x, planes, lengths, C, 10)
            apart = triton_kmeans.hamming_kmeans(codes, lengths, C, 10)
            if not (torch.equal(fused[0], apart[0]) and torch.equal(fused[1], apart[1])):
                bad = int((fused[0] != apart[0]).sum())
                raise CheckFailed(f"{tag}: hash_kmeans differs from hash_codes then hamming_kmeans ({bad} assignments)")
            valid = torch.arange(N, device=device)[None, :] < lengths[:, None]
            logits = randn(B, H, C, N).masked_fill(~valid[:, None, None, :], float("-inf"))
            topk_idx = logits.topk(min(K, N), dim=-1).indices
            msgs = [f"{tag}: hash codes {differ} differ, K-means equal, hash_kmeans equal"]
            for dtype, tol_v, tol_g in ((torch.float32, 1e-4, 1e-3), (torch.bfloat16, 2e-2, 2e-2)):
                q, k, v = (randn(B, H, N, E, dtype=dtype) for _ in range(3))
                w = torch.softmax(randn(B, H, N, topk_idx.shape[-1]), -1).to(dtype)
                g_s = randn(B, H, N, topk_idx.shape[-1], dtype=dtype)
                g_o = randn(B, H, N, E, dtype=dtype)
                results = {}
                for name, mod in (("reference", reference), ("triton", triton_clustered)):
                    leaves = [t.clone().requires_grad_() for t in (q, k, v, w)]
                    if name == "reference":  # the reference in fp32 is the truth for both dtypes
                        leaves = [t.float().detach().requires_grad_() for t in leaves]
                    s = mod.clustered_dot(leaves[0], leaves[1], topk_idx, a_ref)
                    o = mod.clustered_weighted_sum(leaves[3], leaves[2], topk_idx, a_ref)
                    grads = torch.autograd.grad((s * g_s.to(s.dtype)).sum() + (o * g_o.to(o.dtype)).sum(), leaves)
                    results[name] = (s, o, *grads)
                names = ["dot", "wsum", "dq", "dk", "dv", "dw"]
                errs = [_rel(t, r) for t, r in zip(results["triton"], results["reference"])]
                for nm, err in zip(names, errs):
                    tol = tol_v if nm in ("dot", "wsum") else tol_g
                    if not err < tol:  # also catches NaN
                        raise CheckFailed(f"{tag} {dtype}: {nm} relative error {err:.2e} >= {tol:g}")
                msgs.append(f"{str(dtype)[6:]}: max rel err {max(errs):.1e}")
                del q, k, v, w, results
            msgs.append(_check_sparse(B, H, N, E, C, topk_idx, a_ref, lengths, randn))
            if N <= PACKED_CHECK_MAX_N:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                msgs.append(_check_packed(B, H, N, E, lengths, randn))
            else:
                msgs.append(f"full attention paths: not checked above N = {PACKED_CHECK_MAX_N}")
            line = "; ".join(msgs)
            lines.append(line)
            log(f"check ok  {line}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return lines


def _check_sparse(B, H, N, E, C, topk_idx, assignments, lengths, randn) -> str:
    """Improved clustered attention's fused sparse part (``triton_clustered.improved_sparse``)
    against ``reference.improved_sparse`` in fp32: the output and the gradients of q, k, v,
    the centroid values and the top weights, in fp32 and bf16."""
    import torch

    from fastasr.kernels.clustering import reference, triton_clustered

    K = topk_idx.shape[-1]
    msgs = []
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        inputs = [randn(B, H, N, E, dtype=dtype) for _ in range(3)] + [randn(B, H, C, E, dtype=dtype)]
        inputs.append(torch.softmax(randn(B, H, C, K), -1))  # top_w: fp32, as the centroid softmax gives
        grad = randn(B, H, N, E, dtype=dtype)
        results = {}
        for name, fn in (("reference", reference.improved_sparse), ("triton", triton_clustered.improved_sparse)):
            leaves = [t.clone().float() if name == "reference" else t.clone() for t in inputs]
            leaves = [t.requires_grad_() for t in leaves]
            out = fn(*leaves, topk_idx, assignments, lengths, E ** -0.5)
            results[name] = (out, *torch.autograd.grad((out.float() * grad.float()).sum(), leaves))
        names = ["out", "dq", "dk", "dv", "dvalues", "dtop_w"]
        for nm, got, want in zip(names, results["triton"], results["reference"]):
            err = _rel(got, want)
            if not err < tol:  # also catches NaN
                raise CheckFailed(f"improved_sparse {dtype}: {nm} relative error {err:.2e} >= {tol:g}")
        msgs.append(f"{str(dtype)[6:]} {max(_rel(a, b) for a, b in zip(results['triton'], results['reference'])):.1e}")
        del inputs, results
    return "fused sparse part " + ", ".join(msgs)


def _check_packed(B, H, N, E, lengths, randn) -> str:
    """Every exact path of padded full attention (``fastasr.attention.full``: key mask, varlen,
    packed, dense) against SDPA with a key mask in fp32: values and gradients of the valid rows, padded
    rows 0. Several lengths, one of them 0 and one N (a zero-length padding sequence)."""
    import torch

    from fastasr.attention import full

    lengths = lengths.clone()
    if B >= 3:
        lengths[0], lengths[1] = 0, N
    valid = torch.arange(N, device=lengths.device)[None, :] < lengths[:, None]
    msgs = []
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        q, k, v, g = (randn(B, H, N, E, dtype=dtype) for _ in range(4))
        leaves = [t.float().requires_grad_() for t in (q, k, v)]
        want = full.masked_attention(*leaves, lengths)
        want_grads = torch.autograd.grad((want * g.float()).sum(), leaves)
        for path in full.PADDED_PATHS:
            if path == "varlen" and not full.varlen_available(q, v):
                continue
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            got = full._PATH_FUNCTIONS[path](*leaves, lengths)
            grads = torch.autograd.grad((got * g).sum(), leaves)
            if bool(got.transpose(1, 2)[~valid].any()):
                raise CheckFailed(f"full attention, {path}, {dtype}: padded query rows are not 0")
            errs = [_rel(got.transpose(1, 2)[valid], want.transpose(1, 2)[valid])]
            errs += [_rel(a.transpose(1, 2)[valid], b.transpose(1, 2)[valid]) for a, b in zip(grads, want_grads)]
            if not max(errs) < tol:  # also catches NaN
                raise CheckFailed(f"full attention, {path}, {dtype}: relative error {max(errs):.2e} >= {tol:g} "
                                  "(out, dq, dk, dv: " + ", ".join(f"{e:.1e}" for e in errs) + ")")
            msgs.append(f"{path} {str(dtype)[6:]} {max(errs):.1e}")
    return "full attention paths (values, grads) " + ", ".join(msgs)
