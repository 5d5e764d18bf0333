// Zipf ranks by rejection-inversion (Hoermann and Derflinger 1996): the sampler
// parasync-gen-ctr draws its ids with, shared with parasync-bench-compute so that its
// synthetic ctr batches have the ids (and the distinct rows per batch) of the generator's.
//
// A plain value; Sample is const and thread-safe for distinct streams.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace parasync {

// Samples ranks 1..n with P(k) proportional to k^-s in O(1) expected time and no table, as
// Apache Commons' RejectionInversionZipfSampler does: a table over 10^7 ranks per field
// would cost more to build than the whole data set takes to draw.
class ZipfSampler {
 public:
  ZipfSampler(int64_t n, double s)
      : n_(n),
        s_(s),
        h_integral_x1_(HIntegral(1.5) - 1.0),
        h_integral_n_(HIntegral(static_cast<double>(n) + 0.5)),
        squeeze_(2.0 - HIntegralInverse(HIntegral(2.5) - H(2.0))) {}

  // `stream.Uniform()` gives uniform doubles in [0, 1).
  template <typename Stream>
  int64_t Sample(Stream& stream) const {
    while (true) {
      const double u = h_integral_n_ + stream.Uniform() * (h_integral_x1_ - h_integral_n_);
      const double x = HIntegralInverse(u);
      const int64_t k = std::clamp(static_cast<int64_t>(x + 0.5), int64_t{1}, n_);
      const double kd = static_cast<double>(k);
      if (kd - x <= squeeze_ || u >= HIntegral(kd + 0.5) - H(kd)) return k;
    }
  }

 private:
  // log1p(x) / x and expm1(x) / x, by their series near 0 where the quotients lose digits.
  static double Log1pOverX(double x) {
    if (std::abs(x) > 1e-8) return std::log1p(x) / x;
    return 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
  }
  static double Expm1OverX(double x) {
    if (std::abs(x) > 1e-8) return std::expm1(x) / x;
    return 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
  }
  double H(double x) const { return std::exp(-s_ * std::log(x)); }
  // The integral of x^-s, (x^(1-s) - 1) / (1 - s), written to stay accurate near s = 1.
  double HIntegral(double x) const {
    const double log_x = std::log(x);
    return Expm1OverX((1.0 - s_) * log_x) * log_x;
  }
  double HIntegralInverse(double x) const {
    double t = x * (1.0 - s_);
    if (t < -1.0) t = -1.0;  // rounding only; the exact value never passes -1
    return std::exp(Log1pOverX(t) * x);
  }

  int64_t n_;
  double s_;
  double h_integral_x1_;
  double h_integral_n_;
  double squeeze_;
};

}  // namespace parasync
