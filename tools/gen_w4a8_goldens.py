#!/usr/bin/env python3
"""W4A8 weight-format goldens for tests/ops/w4a8_test.cpp, from compressed-tensors itself.

Writes tests/data/ops/w4a8_pack.safetensors. Deterministic. Run with
    python tools/gen_w4a8_goldens.py
(needs torch CPU, safetensors, compressed-tensors 0.20).

Reference (imported and called, not re-implemented): compressed-tensors 0.20
  quantization/utils/helpers.py        calculate_qparams (symmetric minmax: scale = absmax / 7.5,
                                        computed in the weight dtype, zero scale → dtype eps)
  compressors/pack_quantized/base.py   PackedQuantizationCompressor.compress / decompress
                                        (quantize → pack_to_int32; unpack_from_int32 → dequantize)
  compressors/pack_quantized/helpers.py pack_to_int32 / unpack_from_int32

For each group size G in (32, 64, 128) the file holds the bf16 input `weight` [24, 256] and
  packed_g{G}        I32 [24, 256/8]   compress()'s weight_packed
  scale_g{G}         BF16 [24, 256/G]  calculate_qparams' scale (what compress() stores)
  dequant_g{G}       F32 [24, 256]     decompress() with the scale cast to fp32 (exact q·s)
  dequant_bf16_g{G}  BF16 [24, 256]    decompress() as shipped (q·s rounded to bf16)
plus `codes` I8 [24, 256] (unpack_from_int32 of packed_g32, q ∈ [-8, 7]).
"""
import os

import torch
from safetensors.torch import save_file

from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.utils.helpers import calculate_qparams

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "ops")


def make_weight():
    g = torch.Generator().manual_seed(4242)
    out, inn = 24, 256
    w = torch.randn(out, inn, generator=g) * 0.05
    w[1, :] *= 40.0                     # a large-scale row
    w[2, 64:128] = 0.0                  # an all-zero group (zero scale → eps)
    w[3, 5] = 3.0                       # one outlier dominating its group
    # Values on exact quantization ties: absmax 7.5 → scale 1; w/scale = k + 0.5 (round half even).
    w[4, :32] = torch.tensor([7.5] + [(-8 + (i % 16)) + 0.5 for i in range(31)])
    w[5, :] = -w[5, :].abs()            # all negative (absmax from the minimum)
    return w.to(torch.bfloat16)


def main():
    w = make_weight()
    out, inn = w.shape
    tensors = {"weight": w.contiguous()}
    for G in (32, 64, 128):
        args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=G)
        scheme = QuantizationScheme(targets=["Linear"], weights=args)
        wg = w.reshape(out, inn // G, G)
        scale, zp = calculate_qparams(wg.amin(dim=-1), wg.amax(dim=-1), args)
        assert scale.dtype == torch.bfloat16 and tuple(scale.shape) == (out, inn // G)
        comp = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme)
        packed = comp["weight_packed"]
        assert packed.dtype == torch.int32 and tuple(packed.shape) == (out, inn // 8)
        assert "weight_zero_point" not in comp  # symmetric: no zero point stored
        dec_bf16 = PackedQuantizationCompressor.decompress(dict(comp), scheme)["weight"]
        dec_f32 = PackedQuantizationCompressor.decompress(
            {"weight_packed": packed, "weight_scale": scale.float(), "weight_shape": comp["weight_shape"]}, scheme)["weight"]
        assert dec_f32.dtype == torch.float32 and dec_bf16.dtype == torch.bfloat16
        tensors[f"packed_g{G}"] = packed.contiguous()
        tensors[f"scale_g{G}"] = scale.contiguous()
        tensors[f"dequant_g{G}"] = dec_f32.contiguous()
        tensors[f"dequant_bf16_g{G}"] = dec_bf16.contiguous()
        if G == 32:
            codes = unpack_from_int32(packed, 4, torch.Size([out, inn]))
            assert codes.min() >= -8 and codes.max() <= 7
            tensors["codes"] = codes.to(torch.int8).contiguous()
            # The tie row really exercises round-half-even: q = round(k + 0.5).
            assert scale[4, 0].item() == 1.0
    os.makedirs(OUT, exist_ok=True)
    save_file(tensors, os.path.join(OUT, "w4a8_pack.safetensors"),
              metadata={"source": "compressed-tensors 0.20 calculate_qparams + PackedQuantizationCompressor"})
    print("wrote", os.path.join(OUT, "w4a8_pack.safetensors"))


if __name__ == "__main__":
    main()
