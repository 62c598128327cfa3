"""The paper scenarios (paper-latency, paper-message-size, paper-qp-scaling), shrunk: the paper's qualitative
claims (who beats whom), and the `pair` workload, references at a sweep point and the bandwidth plot they
rely on."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from openmrc.cli.main import app
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.scenario import Run, load_scenario, run_scenario
from openmrc.sim.workloads import pair

SMALL_CLOS = ["fabric.hosts=16", "fabric.planes=2", "fabric.t0_radix=8", "fabric.t1_radix=8"]


def reports(name: str, overrides: list[str]) -> dict[str, dict[str, object]]:
    runs: list[Run] = run_scenario(load_scenario(name, overrides))
    return {r.label: r.report() for r in runs}


def test_latency_across_t1_exceeds_latency_within_t0_by_two_hops() -> None:
    latency = 500
    rep = reports("paper-latency", [*SMALL_CLOS, "workload.messages=5", f"fabric.latency_ns={latency}"])
    t0, t1 = rep["MRC within T0"], rep["MRC across T1"]
    for r in (t0, t1):
        assert r["completed"] == r["flows"] == 5
    lat_t0, lat_t1 = float(t0["median_delivery_us"]), float(t1["median_delivery_us"])  # type: ignore[arg-type]
    assert 2 * latency / 1000 <= lat_t0 < lat_t1
    # two more hops: two more links, and the 2-byte packet's serialisation on each (well under 100 ns)
    assert 2 * latency / 1000 <= lat_t1 - lat_t0 < 2 * latency / 1000 + 0.1
    # one message at a time: the sender's completion (a round trip) comes after the receiver's
    assert float(t0["median_fct_us"]) > lat_t0  # type: ignore[arg-type]


def test_bandwidth_rises_with_message_size_and_32k_nearly_fills_the_line() -> None:
    sizes = [64, 1024, 8192, 32768]
    over = [
        *SMALL_CLOS,
        "fabric.evs_per_qp=8",
        "workload.messages=300",
        f'sweep={{"workload.size_bytes" = {sizes}}}',
    ]
    rep = reports("paper-message-size", over)
    fractions = [float(rep[f"MRC 1 QP size_bytes={s}"]["goodput_fraction"]) for s in sizes]  # type: ignore[arg-type]
    assert fractions == sorted(fractions) and fractions[0] < 0.2
    assert fractions[-1] >= 0.9  # the paper: ≈ 96 % at 32 KB


def test_one_mrc_qp_beats_16_roce_qps_which_beat_one() -> None:
    over = [
        "fabric.hosts=32",
        "fabric.planes=4",
        "fabric.t0_radix=16",
        "fabric.t1_radix=16",
        "fabric.evs_per_qp=32",
        "workload.size_kib=512",
        "sample_us=0",
    ]
    rep = reports("paper-qp-scaling", over)
    rate = {label: float(r["job_goodput_gbps"]) for label, r in rep.items()}  # type: ignore[arg-type]
    assert rate["MRC 1 QP"] > rate["RoCEv2 16 QPs"] > rate["RoCEv2 1 QP"]


def test_pair_keeps_depth_messages_outstanding() -> None:
    sim = FabricSim.clos(FabricSimConfig(planes=2, hosts=8, t0_radix=4, t1_radix=4))
    flows = pair(sim, 8192, src=0, dst=5, messages=12, depth=3)
    res = sim.run(until=10**9)
    assert res.summary()["completed"] == 12
    for i, f in enumerate(flows):
        assert f.start is not None and f.finish is not None
        if i >= 3:  # posted the moment message i - depth completed, not before
            assert f.start == flows[i - 3].finish
        outstanding = [g for g in flows if g.start is not None and g.finish is not None]
        assert sum(g.start <= f.start < g.finish for g in outstanding) <= 3  # type: ignore[operator]
    assert flows[0].start == flows[1].start == flows[2].start == 0 < flows[3].start  # type: ignore[operator]


def test_total_kib_caps_the_messages_of_a_large_size() -> None:
    over = [*SMALL_CLOS, "sweep={}", "workload.size_bytes=1048576", "workload.total_kib=4096"]
    (run,) = run_scenario(load_scenario("paper-message-size", over))
    assert run.results is not None and len(run.results.flows) == 4  # 4 MiB in all, not `messages` of 1 MiB


def test_a_reference_at_a_sweep_point_is_printed_beside_openmrcs_figure_with_its_note(tmp_path: Path) -> None:
    over = [
        *SMALL_CLOS,
        "fabric.evs_per_qp=8",
        "workload.messages=50",
        'sweep={"workload.size_bytes" = [1024, 32768]}',
    ]
    args = ["sim", "run", "paper-message-size", "--quiet", "--out", str(tmp_path)]
    for o in over:
        args += ["--set", o]
    out = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    lines = [line for line in out.output.splitlines() if "goodput_fraction paper 0.96" in line]
    assert len(lines) == 1 and "size_bytes=32768" in lines[0] and "openmrc 0." in lines[0]
    assert "no NIC or PCIe limit" in out.output
    assert (tmp_path / "bandwidth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
