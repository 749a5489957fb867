// Pillow's resize kernels, re-implemented from the algorithm of Pillow's libImaging (Resample.c for the
// convolution filters, Geometry.c for NEAREST) so that 8-bit output is bit-identical to Image.resize
// (docs/vision.md §2.3). Images are interleaved samples, row-major, full-image box.
#pragma once

#include <cstdint>
#include <vector>

namespace kestrel::media {

// Image.resize((out_w, out_h), BICUBIC) on 8-bit samples with `ch` channels, each channel independent.
std::vector<uint8_t> resize_bicubic_u8(const uint8_t* in, int w, int h, int ch, int out_w, int out_h);

// The same filter on 16-bit greyscale ("I;16"): Pillow keeps the coefficients in double for this mode.
std::vector<uint16_t> resize_bicubic_u16(const uint16_t* in, int w, int h, int out_w, int out_h);

// Image.resize(..., NEAREST) (what Pillow uses for "P" and "1" whatever the filter): `px` bytes per pixel.
std::vector<uint8_t> resize_nearest(const uint8_t* in, int w, int h, int px, int out_w, int out_h);

}  // namespace kestrel::media
