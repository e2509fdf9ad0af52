"""PyTorch's float32 -> bfloat16 rounding, for the bf16 test: reads little-endian float32 values
from argv[1] and writes the bfloat16 bits (uint16) of each to argv[2]."""
import sys

import numpy as np
import torch

values = torch.from_numpy(np.fromfile(sys.argv[1], dtype="<f4"))
values.to(torch.bfloat16).view(torch.int16).numpy().astype("<u2").tofile(sys.argv[2])
