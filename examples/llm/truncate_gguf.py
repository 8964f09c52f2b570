# examples/llm/truncate_gguf.py -- dev-only: writes a GGUF with the first N transformer blocks of a
# llama-architecture GGUF (used to carry SmolLM2 to the H200 within one device call's 64 MiB).
# usage: python3 truncate_gguf.py SRC.gguf DST.gguf N   (needs PyPI `gguf`; not part of the build)
import sys, gguf, numpy as np
src, dst, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = gguf.GGUFReader(src)
arch = 'llama'
w = gguf.GGUFWriter(dst, arch)
for name, f in r.fields.items():
    if name.startswith('GGUF.') or name == 'general.architecture':
        continue
    vt = f.types[0]
    if name == f'{arch}.block_count':
        w.add_uint32(name, N); continue
    if vt == gguf.GGUFValueType.ARRAY:
        et = f.types[1]
        if et == gguf.GGUFValueType.STRING:
            vals = [bytes(f.parts[i]).decode('utf-8', errors='surrogateescape') for i in f.data]
            w.add_array(name, vals)
        else:
            vals = [f.parts[i].tolist()[0] for i in f.data]
            w.add_key_value(name, vals, vt, sub_type=et)
    elif vt == gguf.GGUFValueType.STRING:
        w.add_string(name, bytes(f.parts[f.data[0]]).decode('utf-8', errors='surrogateescape'))
    else:
        w.add_key_value(name, f.parts[f.data[0]].tolist()[0], vt)
for t in r.tensors:
    if t.name.startswith('blk.') and int(t.name.split('.')[1]) >= N:
        continue
    w.add_tensor(t.name, np.asarray(t.data), raw_shape=np.asarray(t.data).shape, raw_dtype=t.tensor_type)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
