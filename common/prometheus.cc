#include "common/prometheus.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace weft::prometheus {

std::string LabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void Histogram::Observe(double value, uint64_t times) {
  size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket]) ++bucket;
  counts_[bucket] += times;
  count_ += times;
  sum_ += value * static_cast<double>(times);
}

bool Histogram::Add(std::span<const uint64_t> counts, double sum) {
  if (counts.size() != counts_.size()) return false;
  for (size_t i = 0; i < counts.size(); ++i) {
    counts_[i] += counts[i];
    count_ += counts[i];
  }
  sum_ += sum;
  return true;
}

std::string Number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char text[40];
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    std::snprintf(text, sizeof(text), "%.0f", value);
  } else {
    // The shortest of 15 to 17 digits that reads back as the same number (0.025, not
    // 0.025000000000000001).
    for (int digits = 15; digits <= 17; ++digits) {
      std::snprintf(text, sizeof(text), "%.*g", digits, value);
      if (std::strtod(text, nullptr) == value) break;
    }
  }
  return text;
}

void Family(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out.append("# HELP ").append(name).append(" ").append(help).append("\n# TYPE ");
  out.append(name).append(" ").append(type).append("\n");
}

namespace {

void LabelText(std::string& out, const Labels& labels, const std::string* le) {
  if (labels.empty() && le == nullptr) return;
  out += '{';
  bool first = true;
  for (const auto& [name, value] : labels) {
    if (!first) out += ',';
    first = false;
    out.append(name).append("=\"").append(LabelValue(value)).append("\"");
  }
  if (le != nullptr) {
    if (!first) out += ',';
    out.append("le=\"").append(*le).append("\"");
  }
  out += '}';
}

}  // namespace

void Sample(std::string& out, std::string_view name, const Labels& labels, double value) {
  out.append(name);
  LabelText(out, labels, nullptr);
  out.append(" ").append(Number(value)).append("\n");
}

void HistogramSamples(std::string& out, std::string_view name, const Labels& labels,
                      const Histogram& histogram) {
  const std::string bucket = std::string(name) + "_bucket";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= histogram.bounds().size(); ++i) {
    cumulative += histogram.counts()[i];
    const std::string le =
        i < histogram.bounds().size() ? Number(histogram.bounds()[i]) : std::string("+Inf");
    out.append(bucket);
    LabelText(out, labels, &le);
    out.append(" ").append(std::to_string(cumulative)).append("\n");
  }
  Sample(out, std::string(name) + "_sum", labels, histogram.sum());
  Sample(out, std::string(name) + "_count", labels, static_cast<double>(histogram.count()));
}

}  // namespace weft::prometheus
