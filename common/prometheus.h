// Prometheus text exposition (format 0.0.4): metric families with their HELP and TYPE lines,
// samples with escaped label values, and histograms with fixed bucket bounds (cumulative
// `_bucket{le=...}` lines, `_sum`, `_count`). The orchestrator's /metrics is written with it; the
// names and units follow Prometheus's conventions (base units, `_total` for counters), which the
// callers choose.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::prometheus {

// A label value with backslash, double quote and line feed escaped, as the format requires.
std::string LabelValue(std::string_view value);

using Labels = std::vector<std::pair<std::string, std::string>>;

// A histogram over fixed upper bounds (ascending; +Inf is implied): counts per bucket (not
// cumulative; one more than the bounds, the last for values above every bound), sum and count.
class Histogram {
 public:
  explicit Histogram(std::span<const double> bounds)
      : bounds_(bounds.begin(), bounds.end()), counts_(bounds.size() + 1, 0) {}
  void Observe(double value, uint64_t times = 1);
  // Adds per-bucket counts of the same bounds (as a reporter that keeps its own histogram sends
  // them) and their sum; `counts` of another size is ignored (false).
  bool Add(std::span<const uint64_t> counts, double sum);
  std::span<const double> bounds() const { return bounds_; }
  std::span<const uint64_t> counts() const { return counts_; }
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  double sum_ = 0;
};

// A number as the format writes it: integers without an exponent, others in the fewest digits
// that round-trip, NaN and infinities as NaN, +Inf, -Inf.
std::string Number(double value);

// Appends the HELP and TYPE lines of a family ("counter", "gauge" or "histogram").
void Family(std::string& out, std::string_view name, std::string_view type, std::string_view help);
// Appends one sample line: name{labels} value.
void Sample(std::string& out, std::string_view name, const Labels& labels, double value);
// Appends a histogram's samples (name_bucket with `le` after `labels`, name_sum, name_count).
void HistogramSamples(std::string& out, std::string_view name, const Labels& labels,
                      const Histogram& histogram);

}  // namespace weft::prometheus
