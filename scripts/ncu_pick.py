#!/usr/bin/env python3
"""ncu_pick.py: the lines of an Nsight Compute report that decide where a kernel's time goes (issue 11, session 29).

    ncu ... -f -o /tmp/r APP ...
    ncu -i /tmp/r.ncu-rep --page details --csv > details.csv
    ncu -i /tmp/r.ncu-rep --page raw --csv > raw.csv
    python3 scripts/ncu_pick.py details.csv [raw.csv]

From the details page: the metrics named in PICK (duration, clocks, DRAM and SM throughput, issue slots, eligible
and active warps per scheduler, occupancy and its limits, registers, L1 / L2 hit rates), one line each as
"section: metric [unit] value", per kernel in the file. From the raw page (optional): per kernel the average stall
cycles per issued instruction by reason (smsp__average_warps_issue_stalled_REASON_per_issue_active.ratio, largest
first: what a warp waits on, per instruction it issues) and the RAW metrics (the mma.sync tensor pipe's busy cycles
and issued instructions, hmma: the bf16 mma.sync products; session 30's version printed the fp64 dmma ones, all 0;
issue slots, eligible and active warps per scheduler, shared-memory wavefronts).
The columns are found by their header names, so extra columns of other ncu versions do not matter; a details row
may be shorter than its header (ncu 2025.3 leaves the rule columns out of a metric row without a rule: session 30's
version skipped every such row and printed no details at all).
"""
import csv
import re
import sys

PICK = [
    "Duration", "SM Frequency", "DRAM Frequency", "DRAM Throughput", "Memory Throughput", "Compute (SM) Throughput",
    "Issue Slots Busy", "Issued Ipc Active", "Executed Ipc Active", "One or More Eligible", "No Eligible",
    "Active Warps Per Scheduler", "Eligible Warps Per Scheduler", "Warp Cycles Per Issued Instruction",
    "Warp Cycles Per Executed Instruction", "Registers Per Thread", "Block Limit Registers", "Block Limit Shared Mem",
    "Block Limit Warps", "Theoretical Occupancy", "Achieved Occupancy", "Achieved Active Warps Per SM",
    "Waves Per SM", "Dynamic Shared Memory Per Block", "L1/TEX Hit Rate", "L2 Hit Rate", "Mem Busy", "Max Bandwidth",
    "Executed Instructions", "Local Memory Spilling Requests",
]
RAW = [
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active", "smsp__warps_eligible.avg.per_cycle_active",
    "smsp__warps_active.avg.per_cycle_active", "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed",
    "l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__time_duration.sum",
]
STALL = re.compile(r"^smsp__average_warps?_issue_stalled_(\w+?)_per_issue_active\.ratio$")


def details(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    hdr_i = next((i for i, r in enumerate(rows) if "Metric Name" in r and "Metric Value" in r), None)
    if hdr_i is None:
        print(f"ncu_pick: {path}: no details table (Metric Name / Metric Value columns)")
        return
    H = {h: i for i, h in enumerate(rows[hdr_i])}
    kcol, scol = H.get("Kernel Name"), H.get("Section Name")
    need = max(H["Metric Name"], H["Metric Unit"], H["Metric Value"], kcol or 0, scol or 0)
    last = None
    for r in rows[hdr_i + 1:]:
        if len(r) <= need or r[H["Metric Name"]] not in PICK:
            continue
        k = r[kcol] if kcol is not None else "?"
        if k != last:
            print(f"kernel {k[:150]}")
            last = k
        sec = r[scol] if scol is not None else ""
        print(f"  {sec}: {r[H['Metric Name']]} [{r[H['Metric Unit']]}] {r[H['Metric Value']]}")


def raw(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 3:
        print(f"ncu_pick: {path}: no raw table")
        return
    hdr = rows[0]
    kcol = hdr.index("Kernel Name") if "Kernel Name" in hdr else None
    for r in rows[2:]:  # row 1: the units
        if len(r) != len(hdr):
            continue
        print(f"kernel {r[kcol][:150] if kcol is not None else '?'}: stall cycles per issued instruction")
        st = []
        for i, h in enumerate(hdr):
            m = STALL.match(h)
            if m:
                try:
                    st.append((float(r[i].replace(",", "")), m.group(1)))
                except ValueError:
                    pass
        st.sort(reverse=True)
        tot = sum(v for v, _ in st)
        print("  total %.2f: " % tot + ", ".join(f"{k} {v:.2f}" for v, k in st if v >= 0.01))
        col = {h: i for i, h in enumerate(hdr)}
        for h in RAW:
            if h in col:
                print(f"  {h} {r[col[h]]}")


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    details(argv[1])
    if len(argv) > 2:
        raw(argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
