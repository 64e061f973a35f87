#!/usr/bin/env python3
# ds41 scripts/cuda-host-emu: rewrites a .cu file for the host emulator: `k<<<grid, block, smem,
# stream>>>(args)` -> `emu::Launch(grid, block, smem, stream).run(k, args)`, and the dynamic
# shared-memory declaration -> the emulated CTA's buffer.  usage: rewrite_launches.py IN.cu OUT.cpp
import re, sys
src, dst = sys.argv[1], sys.argv[2]
s = open(src).read()
s = re.sub(r'extern __shared__ (?:__align__\(\d+\) )?float smem\[\];', 'float* smem = emu::dyn_smem<float>();', s)
# The kernel is called through a generic lambda, so template parameters that the launch leaves to
# deduction (kernel<kOp><<<...>>>(args) with T deduced from args) are deduced as on the device.
s = re.sub(r'([\w:]+(?:<[^<>;()]*>)?)\s*<<<(.+?)>>>\s*\(',
           lambda m: 'emu::Launch(%s).run([&](auto... ds41_emu_a) { %s(ds41_emu_a...); }, ' % (m.group(2), m.group(1)),
           s, flags=re.S)
open(dst, 'w').write(s)
