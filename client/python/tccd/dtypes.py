"""torch <-> tcc.v1 mappings: dtypes, devices, modes."""
import torch

from ._proto import tcc_pb2 as pb

TORCH_TO_PB = {
    torch.float32: pb.FLOAT32,
    torch.float64: pb.FLOAT64,
    torch.float16: pb.FLOAT16,
    torch.bfloat16: pb.BFLOAT16,
    torch.int8: pb.INT8,
    torch.int16: pb.INT16,
    torch.int32: pb.INT32,
    torch.int64: pb.INT64,
    torch.uint8: pb.UINT8,
    torch.bool: pb.BOOL,
}
PB_TO_TORCH = {v: k for k, v in TORCH_TO_PB.items()}

DEVICE_TO_PB = {"cpu": pb.CPU, "cuda": pb.CUDA}

MODES = {
    "default": pb.DEFAULT,
    "reduce-overhead": pb.REDUCE_OVERHEAD,
    "max-autotune": pb.MAX_AUTOTUNE,
    "max-autotune-no-cudagraphs": pb.MAX_AUTOTUNE_NO_CUDAGRAPHS,
}


def dtype_to_pb(dtype):
    """The tcc.v1.DType of a torch dtype, or None when the wire has none."""
    return TORCH_TO_PB.get(dtype)


def mode_to_pb(mode):
    """tcc.v1.Mode of a torch.compile mode string (None = "default")."""
    key = "default" if mode is None else str(mode)
    if key not in MODES:
        raise ValueError(f"tccd: unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    return MODES[key]
