# SPDX-License-Identifier: Apache-2.0
"""``benchmarks/gpu_check.py``: its host-round-trip counter, its report and one section run in-process (CPU)."""

import importlib.util
from pathlib import Path

import torch

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", _PATH)
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)

CPU = torch.device("cpu")


def test_host_reads_are_counted_per_call_and_optimiser_counters_are_not():
    x = torch.ones(3)

    def two_reads():
        float((x * 2).sum())
        if bool((x > 0).all()):
            x.add_(0.0)

    def no_read():
        (x * 2).sum()

    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([param], lr=1e-3)

    def adam_step():  # Adam reads its host-side step counter with .item(): not a device round-trip
        opt.zero_grad()
        (param ** 2).sum().backward()
        opt.step()

    assert gpu_check.count_host_syncs(two_reads, 3, CPU) == {
        "sync": 0.0, "dtoh": 0.0, "reads": 2.0, "sync window": 0.0, "dtoh window": 0.0, "reads window": 0.0}
    assert gpu_check.count_host_syncs(no_read, 3, CPU)["reads"] == 0.0
    assert gpu_check.count_host_syncs(adam_step, 3, CPU)["reads"] == 0.0


def test_round_trips_of_the_profiled_window_are_not_counted_per_call(monkeypatch):
    # a window holding one synchronisation of its own (the profiler's flush when it stops) besides 2 per call
    monkeypatch.setattr(gpu_check, "_profiled_counts", lambda fn, calls, device: {"sync": 2 * calls + 1, "dtoh": calls,
                                                                                   "reads": 0})
    counts = gpu_check.count_host_syncs(lambda: None, 5, CPU)
    assert (counts["sync"], counts["sync window"]) == (2.0, 1.0)
    assert (counts["dtoh"], counts["dtoh window"]) == (1.0, 0.0)


def test_dry_run_judges_code_paths_but_not_gpu_targets():
    report = gpu_check.Report(CPU)
    report.add("speed", "a ratio", "1.00", "<= 1.2", False)
    report.add("speed", "a figure", "3")
    report.add("tests", "a command", "exit 0", "exit 0", True, gpu_target=False)
    assert [r["status"] for r in report.rows] == ["dry run", "reported", "met"]
    assert not report.failed
    assert "| speed | a ratio | 1.00 | <= 1.2 | dry run | CPU (dry run) |" in report.markdown()
    report.add("job", "a failing command", "exit 2", "exit 0", False, gpu_target=False)
    assert report.rows[-1]["status"] == "missed" and report.failed


def test_one_section_in_process_writes_the_table_and_a_raising_section_fails_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same rows on a machine with GPUs
    code = gpu_check.main(["--device", "cpu", "--sections", "nccl", "--output", str(tmp_path / "a")])
    assert code == 0
    table = (tmp_path / "a" / "gpu_check.md").read_text()
    assert "| nccl | torchrun NCCL world (all-reduce, data-parallel SVI) | skipped: no CUDA device |" in table

    def broken(report, budget, args):
        raise RuntimeError("boom")

    monkeypatch.setitem(gpu_check.RUNNERS, "nccl", broken)
    assert gpu_check.main(["--device", "cpu", "--sections", "nccl", "--output", str(tmp_path / "b")]) == 1
    assert "| nccl | nccl: the section raised | RuntimeError: boom | runs | failed |" in (
        tmp_path / "b" / "gpu_check.md").read_text()


def test_reads_count_only_tensors_on_the_checked_device():
    for device, expected in ((torch.device("cuda"), 0), (CPU, 1)):  # a host tensor's read never waits for a GPU
        reads = gpu_check._HostReads(device)
        with reads:
            float(torch.ones(()))
        assert reads.count == expected, device
