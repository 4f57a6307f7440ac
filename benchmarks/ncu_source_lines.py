"""Warp-stall samples of one prefill kernel per Python source line, from an ncu source export.

On the GPU machine::

    ncu --clock-control none -k regex:chunk_intra --launch-skip 1 --launch-count 1 \
        --section SourceCounters --section WarpStateStats --import-source yes -o rep \
        python3 benchmarks/prefill_profile.py --families gdn
    ncu -i rep.ncu-rep --page source --csv --print-source sass > sass.csv

Then here (no GPU; ``nvdisasm`` and ``cuobjdump`` from triton's bundled CUDA tools on PATH)::

    python benchmarks/ncu_source_lines.py sass.csv gdn chunk_intra_kernel

It builds the same launch for sm_90 locally (the prefill launcher on small CPU tensors, captured
by ``registry.capture_launches``), reads the line table with ``nvdisasm -g`` and adds the samples
of each SASS instruction to its source line. The SASS must match the profiled build: the script
prints how many opcodes differ (0 when the sources and the Triton version are the same).
"""
import collections
import csv
import os
import re
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def build_sass_lines(family: str, kernel: str):
    """``(offset -> (file, line), [(offset, instruction)])`` of the sm_90 build of ``kernel``, as the
    prefill launcher makes it for bf16, K = V = 128 (the benchmark's configuration)."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "prefill"))
    from prefill_cases import make_inputs, random_states

    from linattn.capabilities import profile
    from linattn.kernels.triton import prefill as pm
    from linattn.kernels.triton import registry

    inp = make_inputs(family, [70, 5], H=2, HV=4, K=128, V=128, dtype=torch.bfloat16)
    pool = random_states(3, 4, 128, 128)
    with registry.capture_launches() as launches:
        pm.chunk_prefill(family, **inp, state_pool=pool, state_indices=torch.tensor([2, 0]), initial_state=None,
                         scale=0.1, use_qk_l2norm=True, state_layout="vk", caps=profile("sm90"),
                         **({"fused": True} if "fused" in kernel else {}))
    launch = [x for x in launches if x.name == kernel][0]
    built = registry.compile_launch(launch, arch=90)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(built.asm["cubin"])
    dis = subprocess.run(["nvdisasm", "-g", "-c", f.name], capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    cur, off2line, ops = None, {}, []
    for line in dis.splitlines():
        m = re.search(r'//## File "([^"]+)", line (\d+)', line)
        if m:
            cur = (m.group(1).split("/")[-1], int(m.group(2)))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            off2line[int(m.group(1), 16)] = cur
            ops.append((int(m.group(1), 16), m.group(2).strip()))
    return off2line, ops


def main():
    csv_path, family, kernel = sys.argv[1:4]
    off2line, ops = build_sass_lines(family, kernel)
    with open(csv_path) as f:
        rows = list(csv.reader(f))
    hdr, data = rows[1], rows[2:]
    ia, isrc = hdr.index("Address"), hdr.index("Source")
    isamp, iexe = hdr.index("Warp Stall Sampling (All Samples)"), hdr.index("Instructions Executed")
    base = int(data[0][ia], 16)
    samples, executed = collections.Counter(), collections.Counter()
    mismatched = total = 0
    for i, r in enumerate(data):
        key = off2line.get(int(r[ia], 16) - base)
        if i < len(ops) and ops[i][1].split()[0].split(".")[0] not in r[isrc]:
            mismatched += 1
        n = int(r[isamp] or 0)
        total += n
        samples[key] += n
        executed[key] += int(r[iexe] or 0)
    print(f"{kernel} ({family}): {total} samples; opcodes differing from the local build: {mismatched} of {len(data)}")
    for key, n in samples.most_common(35):
        text = ""
        if key:
            try:
                with open(os.path.join(HERE, "..", "kernels", "triton", key[0])) as f:
                    text = f.read().splitlines()[key[1] - 1].strip()[:90]
            except (OSError, IndexError):
                pass
        print(f"{100 * n / max(total, 1):5.1f}%  executed={executed[key]:>10}  {key}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
