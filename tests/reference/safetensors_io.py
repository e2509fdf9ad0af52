"""A plain-Python safetensors reader and writer (no safetensors package needed).

Format: 8-byte little-endian header length N, then N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__"},
then the raw little-endian tensor bytes; offsets are relative to the end of the header.
"""
import json
import struct

import numpy as np
import torch

# safetensors dtype name -> numpy little-endian dtype
_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "U8": np.dtype("u1"),
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}

# The spec asks writers to pad the header so the data starts 8-byte aligned.
_ALIGN = 8


def load(path):
    """Returns {name: torch tensor} with each tensor's stored dtype and shape."""
    with open(path, "rb") as f:
        blob = f.read()
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_len])
    data_start = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        dtype = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        array = np.frombuffer(blob, dtype=dtype, count=(end - begin) // dtype.itemsize,
                              offset=data_start + begin)
        tensors[name] = torch.from_numpy(array.reshape(tuple(info["shape"])).copy())
    return tensors


def save(path, tensors):
    """Writes {name: torch tensor or numpy array}, keeping each tensor's dtype."""
    header, chunks, offset = {}, [], 0
    for name, tensor in tensors.items():
        array = _to_numpy(tensor)
        data = array.tobytes()
        header[name] = {"dtype": _NAMES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % _ALIGN)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for data in chunks:
            f.write(data)


def _to_numpy(tensor):
    array = tensor.detach().cpu().numpy() if isinstance(tensor, torch.Tensor) else tensor
    array = np.asarray(array, order="C")  # (ascontiguousarray would make a scalar 1-d)
    little_endian = array.dtype.newbyteorder("<")
    if little_endian not in _NAMES:
        raise ValueError(f"unsupported dtype {array.dtype}")
    return array.astype(little_endian, copy=False)
