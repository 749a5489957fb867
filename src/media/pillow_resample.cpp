// Built with -ffp-contract=off (src/media/CMakeLists.txt): Pillow's wheels are built for baseline x86-64,
// which has no FMA, so every multiply and add below rounds separately there; contracting them here would
// move coefficients by an ulp and, through the fixed-point rounding, output pixels by one level.
#include "media/pillow_resample.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace kestrel::media {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // fixed-point bits of the 8-bit path

// Keys' cubic convolution with a = -0.5, support 2 (Pillow's BICUBIC).
double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// Per output position: the first input index, the tap count and ksize normalised weights. The filter is
// widened by the downscale factor (antialiasing); a window is rounded to whole input pixels and clipped
// to the image, and its weights are renormalised to sum to one.
struct Coeffs {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<double> k;  // out_size * ksize
};

Coeffs precompute(int in_size, int out_size) {
  Coeffs c;
  // Pillow passes the box as float; (float)in_size - 0 is exact for any size this library accepts.
  const double scale = static_cast<double>(static_cast<float>(in_size)) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 2.0 * filterscale;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.k.assign(size_t(out_size) * c.ksize, 0.0);
  const double inv_filterscale = 1.0 / filterscale;
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    int xmin = static_cast<int>(center - support + 0.5);  // truncation toward zero, as Pillow's (int) cast
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double* k = &c.k[size_t(xx) * c.ksize];
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = bicubic((x + xmin - center + 0.5) * inv_filterscale);
      k[x] = w;
      ww += w;
    }
    if (ww != 0.0)
      for (int x = 0; x < xmax; ++x) k[x] /= ww;
    c.first[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

// Weights in 22-bit fixed point, rounded half away from zero.
std::vector<int32_t> to_fixed(const std::vector<double>& k) {
  std::vector<int32_t> out(k.size());
  for (size_t i = 0; i < k.size(); ++i)
    out[i] = k[i] < 0 ? static_cast<int32_t>(-0.5 + k[i] * (1 << kPrecisionBits))
                      : static_cast<int32_t>(0.5 + k[i] * (1 << kPrecisionBits));
  return out;
}

uint8_t clip8(int32_t ss) {
  const int32_t v = ss >> kPrecisionBits;  // arithmetic shift (floor), as Pillow's table index
  return static_cast<uint8_t>(std::clamp(v, 0, 255));
}

uint16_t clip16_round(double ss) {
  // Pillow's ROUND_UP adds a float 0.5 (exact in double) and truncates, then clips to 16 bits.
  const int v = static_cast<int>(ss >= 0.0 ? ss + 0.5F : ss - 0.5F);
  return static_cast<uint16_t>(std::clamp(v, 0, 65535));
}

// One convolution pass over interleaved samples. Horizontal: rows [row0, row0 + rows) of a w-wide source
// become out_w-wide rows. Vertical: each output row yy reads source rows first[yy] - row_shift onwards.
// Fixed selects the 8-bit arithmetic (22-bit integer weights) or the 16-bit one (double weights).
template <typename T, bool Fixed>
struct Pass {
  static std::vector<T> horizontal(const T* src, int w, int ch, int row0, int rows, const Coeffs& c, int out_w) {
    std::vector<T> out(size_t(rows) * out_w * ch);
    const std::vector<int32_t> ki = Fixed ? to_fixed(c.k) : std::vector<int32_t>();
    for (int y = 0; y < rows; ++y) {
      const T* line = src + size_t(row0 + y) * w * ch;
      T* o = &out[size_t(y) * out_w * ch];
      for (int xx = 0; xx < out_w; ++xx) {
        const T* p = line + size_t(c.first[xx]) * ch;
        for (int k = 0; k < ch; ++k) o[size_t(xx) * ch + k] = tap(p + k, ch, c, ki, xx);
      }
    }
    return out;
  }
  // Row by row: every sample of an output row accumulates its taps in tap order (the order `tap` uses, so the
  // same sums bit for bit), a whole source row per tap, which the compiler vectorises across the row.
  static std::vector<T> vertical(const T* src, int w, int ch, int row_shift, const Coeffs& c, int out_h) {
    using Acc = std::conditional_t<Fixed, int32_t, double>;
    const size_t stride = size_t(w) * ch;
    std::vector<T> out(size_t(out_h) * stride);
    const std::vector<int32_t> ki = Fixed ? to_fixed(c.k) : std::vector<int32_t>();
    std::vector<Acc> ss(stride);
    for (int yy = 0; yy < out_h; ++yy) {
      const T* col = src + size_t(c.first[yy] - row_shift) * stride;
      std::fill(ss.begin(), ss.end(), Fixed ? Acc(1 << (kPrecisionBits - 1)) : Acc(0));  // rounding bias
      for (int t = 0; t < c.count[yy]; ++t) {
        const T* row = col + size_t(t) * stride;
        const Acc kt = Fixed ? Acc(ki[size_t(yy) * c.ksize + t]) : Acc(c.k[size_t(yy) * c.ksize + t]);
        Acc* acc = ss.data();
        for (size_t i = 0; i < stride; ++i) acc[i] += row[i] * kt;
      }
      T* o = &out[size_t(yy) * stride];
      for (size_t i = 0; i < stride; ++i) {
        if constexpr (Fixed) o[i] = clip8(ss[i]);
        else o[i] = clip16_round(ss[i]);
      }
    }
    return out;
  }
  // Sum of count[j] taps `step` samples apart, weighted by the coefficients of output position j.
  static T tap(const T* p, size_t step, const Coeffs& c, const std::vector<int32_t>& ki, int j) {
    if constexpr (Fixed) {
      const int32_t* k = &ki[size_t(j) * c.ksize];
      int32_t ss = 1 << (kPrecisionBits - 1);  // rounding bias
      for (int t = 0; t < c.count[j]; ++t) ss += p[t * step] * k[t];
      return clip8(ss);
    } else {
      const double* k = &c.k[size_t(j) * c.ksize];
      double ss = 0.0;
      for (int t = 0; t < c.count[j]; ++t) ss += p[t * step] * k[t];
      return clip16_round(ss);
    }
  }
};

// Pillow 13's two-pass order: the vertical pass runs first when the height shrinks by more than twice
// as many pixels as the width does; otherwise the horizontal pass runs first, over only the source rows
// the vertical pass will read. A pass whose size is unchanged is skipped. The order changes the uint8
// intermediate, hence the output.
template <typename T, bool Fixed>
std::vector<T> resize_two_pass(const T* in, int w, int h, int ch, int out_w, int out_h) {
  using P = Pass<T, Fixed>;
  const bool need_h = out_w != w, need_v = out_h != h;
  const bool horizontal_first = !((h - out_h) > 0 && (h - out_h) > (w - out_w) * 2);
  if (!need_h && !need_v) return std::vector<T>(in, in + size_t(w) * h * ch);
  if (horizontal_first) {
    const Coeffs cv = precompute(h, out_h);
    const int first = cv.first[0], last = cv.first[out_h - 1] + cv.count[out_h - 1];
    if (!need_h) return P::vertical(in, w, ch, 0, cv, out_h);
    const std::vector<T> tmp = P::horizontal(in, w, ch, first, last - first, precompute(w, out_w), out_w);
    if (!need_v) return tmp;
    return P::vertical(tmp.data(), out_w, ch, first, cv, out_h);
  }
  const std::vector<T> tmp = P::vertical(in, w, ch, 0, precompute(h, out_h), out_h);
  if (!need_h) return tmp;
  return P::horizontal(tmp.data(), w, ch, 0, out_h, precompute(w, out_w), out_w);
}

}  // namespace

std::vector<uint8_t> resize_bicubic_u8(const uint8_t* in, int w, int h, int ch, int out_w, int out_h) {
  return resize_two_pass<uint8_t, true>(in, w, h, ch, out_w, out_h);
}

std::vector<uint16_t> resize_bicubic_u16(const uint16_t* in, int w, int h, int out_w, int out_h) {
  return resize_two_pass<uint16_t, false>(in, w, h, 1, out_w, out_h);
}

std::vector<uint8_t> resize_nearest(const uint8_t* in, int w, int h, int px, int out_w, int out_h) {
  // Pillow's affine scaling: the source coordinate starts at half a step and is advanced by repeated
  // addition (not multiplication), then truncated; positions outside the source stay zero.
  const double ax = static_cast<double>(static_cast<float>(w)) / out_w;
  const double ay = static_cast<double>(static_cast<float>(h)) / out_h;
  std::vector<int> xin(out_w, -1);
  double xo = ax * 0.5;
  for (int x = 0; x < out_w; ++x) {
    const int xi = xo < 0.0 ? -1 : static_cast<int>(xo);
    if (xi >= 0 && xi < w) xin[x] = xi;
    xo += ax;
  }
  std::vector<uint8_t> out(size_t(out_w) * out_h * px, 0);
  double yo = ay * 0.5;
  for (int y = 0; y < out_h; ++y) {
    const int yi = yo < 0.0 ? -1 : static_cast<int>(yo);
    if (yi >= 0 && yi < h) {
      const uint8_t* line = in + size_t(yi) * w * px;
      uint8_t* o = &out[size_t(y) * out_w * px];
      for (int x = 0; x < out_w; ++x)
        if (xin[x] >= 0) std::copy_n(line + size_t(xin[x]) * px, px, o + size_t(x) * px);
    }
    yo += ay;
  }
  return out;
}

}  // namespace kestrel::media
