"""Interval arithmetic of the overlap-efficiency metric, on synthetic traces."""

import pytest

from mbridge_ep_overlap.lab.trace import analyze, classify, intersection, length, union


def k(name, ts, dur):
    return {"name": name, "ts": ts, "dur": dur}


def test_classify():
    assert classify("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)") == "a2a"
    assert classify("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "comm"
    assert classify("sm90_xmma_gemm_bf16bf16_bf16f32") == "compute"


@pytest.mark.parametrize("name,kind", [
    ("void deep_ep::intranode::dispatch<2, 768, 8192>(int4*, float*, int*, long*)", "a2a"),
    ("void deep_ep::intranode::notify_dispatch<2>(int const*, int*, int)", "a2a"),
    ("void deep_ep::internode::combine<false, 2, 4>(int4*)", "a2a"),
    ("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*)", "compute"),
    ("void hybrid_ep::dispatch_kernel<__nv_bfloat16, 2, 1>(hybrid_ep::dispatch_kernel_param_t<__nv_bfloat16>)", "a2a"),
    ("void hybrid_ep::combine_kernel<2, 1>(hybrid_ep::combine_kernel_param_t)", "a2a"),
    ("void hybrid_ep::scan<128>(bool const*, int*)", "compute"),
    ("void permute_kernel<__nv_bfloat16>(...)", "compute"),
])
def test_flex_dispatcher_kernels(name, kind):
    assert classify(name) == kind


def test_union_and_intersection():
    u = union([(5, 8), (0, 2), (1, 3), (8, 9), (10, 10)])
    assert u == [(0, 3), (5, 9)] and length(u) == 7
    assert intersection([(0, 3), (5, 9)], [(2, 6), (8, 20)]) == [(2, 3), (5, 6), (8, 9)]
    assert intersection([], [(0, 1)]) == []


def test_fully_exposed_and_fully_hidden():
    serial = [k("gemm", 0, 100), k("ncclDevKernel_SendRecv", 100, 50)]
    e = analyze(serial, iterations=1, measured_window_s=150e-6)
    assert e.hidden_fraction == 0 and e.exposed_s == pytest.approx(50e-6)
    assert e.ideal_step_s == pytest.approx(100e-6) and e.measured_step_s == pytest.approx(150e-6)
    hidden = [k("gemm", 0, 100), k("ncclDevKernel_SendRecv", 20, 50)]
    assert analyze(hidden, 1, 100e-6).hidden_fraction == 1.0


def test_concurrent_compute_is_not_double_counted():
    trace = [k("gemm_a", 0, 100), k("gemm_b", 50, 100), k("ncclDevKernel_SendRecv", 120, 60),
             k("ncclDevKernel_AllReduce", 300, 10)]
    e = analyze(trace, iterations=2, measured_window_s=400e-6)
    assert e.compute_s == pytest.approx(150e-6)
    assert e.a2a_s == pytest.approx(60e-6) and e.hidden_s == pytest.approx(30e-6)
    assert e.hidden_fraction == pytest.approx(0.5)
    assert e.comm_s == pytest.approx(70e-6)
    assert e.ideal_step_s == pytest.approx(75e-6)


def test_no_all_to_all_kernel_means_no_hidden_fraction():
    e = analyze([{"name": "sm90_xmma_gemm_bf16", "ts": 0, "dur": 100}], iterations=1, measured_window_s=1e-4)
    assert e.a2a_s == 0 and e.hidden_fraction is None


# ---- idle time, the window's breakdown, the overlapped span and what lies outside ----
A2A = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
ADAM = "void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor<float>>(...)"


def combined_1f1b_iteration(o, optimizer=True):
    """One iteration (microseconds from ``o``) the way combined-1F1B lays it out: the first forward
    alone (its dispatch exposed), three overlapped pairs (each all-to-all outlasts its compute by
    100 and is followed by 100 idle), the last backward alone (its combine exposed), the DP
    all-reduce, the optimizer, 200 idle. 7000 per iteration."""
    kernels = [k("gemm_fwd", o, 1000), k(A2A, o + 1000, 300), k("gemm_fwd", o + 1300, 700)]
    for j in range(3):
        base = o + 2000 + j * 1000
        kernels += [k("gemm_pair", base, 800), k(A2A, base + 100, 800)]
    kernels += [k("gemm_bwd", o + 5000, 1000), k(A2A, o + 6000, 300),
                k("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", o + 6300, 200)]
    kernels.append(k(ADAM if optimizer else "elementwise_kernel", o + 6500, 300))
    return kernels


def test_idle_and_breakdown_add_up_to_the_window():
    trace = combined_1f1b_iteration(0) + combined_1f1b_iteration(7000)
    e = analyze(trace, iterations=2, measured_window_s=14500e-6)  # 700 us of window beyond the kernels
    assert e.busy_s == pytest.approx(13000e-6)
    assert e.idle_step_s == pytest.approx(750e-6)
    b = e.breakdown_step_s
    assert b == pytest.approx({"compute_only": 3300e-6, "a2a_only": 900e-6, "both": 2100e-6, "comm_only": 200e-6,
                               "idle": 750e-6})
    assert sum(b.values()) == pytest.approx(e.measured_step_s)
    assert b["a2a_only"] * 2 == pytest.approx(e.exposed_s) and b["both"] * 2 == pytest.approx(e.hidden_s)
    # the fields results.json files already use are unchanged
    for name in ("iterations", "a2a_s", "comm_s", "compute_s", "hidden_s", "exposed_s", "hidden_fraction",
                 "ideal_step_s", "measured_step_s"):
        assert name in e.to_dict()


def test_overlapped_span_first_forward_last_backward_and_optimizer():
    trace = combined_1f1b_iteration(0) + combined_1f1b_iteration(7000)
    p = analyze(trace, iterations=2, measured_window_s=14500e-6).phases
    assert p["iterations_found"] == 2 and "optimizer" in p["how"]
    assert p["overlapped_span_step_s"] == pytest.approx(2700e-6)
    assert p["inside"] == pytest.approx({"compute_only": 200e-6, "a2a_only": 200e-6, "both": 2100e-6,
                                         "comm_only": 0.0, "idle": 200e-6})
    assert p["outside_step_s"] == pytest.approx(4550e-6) and p["unlocated_step_s"] == pytest.approx(350e-6)
    assert p["outside"] == pytest.approx({"compute_only": 3100e-6, "a2a_only": 700e-6, "both": 0.0,
                                          "comm_only": 200e-6, "idle": 550e-6})
    assert p["first_forward_s"] == pytest.approx(2200e-6)  # 2100 then 2300 (after the optimizer)
    assert p["last_backward_s"] == pytest.approx(1700e-6)
    assert p["optimizer_s"] == pytest.approx(300e-6)
    assert p["first_forward_s"] + p["last_backward_s"] + p["optimizer_s"] == pytest.approx(
        p["outside_step_s"] - p["unlocated_step_s"])
    assert p["largest_gap_inside_spans_s"] == pytest.approx(300e-6)


def test_without_optimizer_kernels_iterations_split_at_the_largest_gap():
    trace = combined_1f1b_iteration(0, optimizer=False) + combined_1f1b_iteration(7000, optimizer=False)
    p = analyze(trace, iterations=2, measured_window_s=14000e-6).phases
    assert p["iterations_found"] == 2 and "largest gaps" in p["how"]
    assert p["overlapped_span_step_s"] == pytest.approx(2700e-6)
    assert p["first_forward_s"] is None and p["last_backward_s"] is None and "not split" in p["note"]


def test_overlap_off_has_no_overlapped_span():
    # overlap off: the all-to-all never runs beside compute, except a chance 5-us coincidence
    trace = [k("gemm", 0, 1000), k(A2A, 1000, 500), k("gemm", 1500, 1000), k("tiny_fill", 1600, 5),
             k(A2A, 1602, 2), k(A2A, 2500, 500)]
    e = analyze(trace, iterations=1, measured_window_s=3100e-6)
    assert e.phases is None
    assert e.idle_step_s == pytest.approx(100e-6)
    assert e.breakdown_step_s["a2a_only"] == pytest.approx(1000e-6)


def test_a_single_iteration_and_an_empty_trace():
    e = analyze(combined_1f1b_iteration(0), iterations=1, measured_window_s=7000e-6)
    assert e.phases["iterations_found"] == 1
    assert e.phases["first_forward_s"] == pytest.approx(2100e-6)
    assert e.phases["last_backward_s"] == pytest.approx(1700e-6)
    empty = analyze([], iterations=2, measured_window_s=1e-3)
    assert empty.busy_s == 0 and empty.idle_step_s == pytest.approx(0.5e-3) and empty.phases is None


def test_optimizer_kernels_are_compute():
    from mbridge_ep_overlap.lab.trace import is_optimizer

    assert classify(ADAM) == "compute" and is_optimizer(ADAM)
    assert not is_optimizer("sm90_xmma_gemm_bf16bf16_bf16f32") and not is_optimizer(A2A)
