"""Interval arithmetic of the overlap-efficiency metric, on synthetic traces."""

import pytest

from mbridge_ep_overlap.tools.trace import analyze, classify, intersection, length, union


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
