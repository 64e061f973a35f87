#!/usr/bin/env python3
# ds41 scripts/cuda-host-emu: rewrites a .cu file for the host emulator: `k<<<grid, block, smem,
# stream>>>(args)` -> `emu::Launch(grid, block, smem, stream).run(k, args)`, and the dynamic
# shared-memory declaration -> the emulated CTA's buffer.  usage: rewrite_launches.py IN.cu OUT.cpp
import re, sys
src, dst = sys.argv[1], sys.argv[2]
s = open(src).read()
s = re.sub(r'extern __shared__ (?:__align__\(\d+\) )?float smem\[\];', 'float* smem = emu::dyn_smem<float>();', s)
s = re.sub(r'([\w:]+(?:<[^<>;()]*>)?)\s*<<<(.+?)>>>\s*\(', lambda m: 'emu::Launch(%s).run(%s, ' % (m.group(2), m.group(1)), s, flags=re.S)
open(dst, 'w').write(s)
