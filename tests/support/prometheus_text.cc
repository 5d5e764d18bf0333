#include "tests/support/prometheus_text.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace parasync::testing {
namespace {

bool IsNameStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_' || c == ':';
}
bool IsNameChar(char c) { return IsNameStart(c) || std::isdigit(static_cast<unsigned char>(c)); }
bool IsBlank(char c) { return c == ' ' || c == '\t'; }

// Reads the name at `at` (a metric's or a label's) and moves past it; empty when none is there.
std::string ReadName(std::string_view line, size_t& at) {
  const size_t start = at;
  if (at < line.size() && IsNameStart(line[at])) {
    while (at < line.size() && IsNameChar(line[at])) ++at;
  }
  return std::string(line.substr(start, at - start));
}

// Reads `{name="value",...}` at `at` (the opening brace) into `labels`; false when malformed.
bool ReadLabels(std::string_view line, size_t& at, PrometheusLabels& labels) {
  ++at;  // '{'
  while (at < line.size() && line[at] != '}') {
    const std::string name = ReadName(line, at);
    if (name.empty() || line.substr(at, 2) != "=\"") return false;
    at += 2;
    std::string value;
    for (; at < line.size() && line[at] != '"'; ++at) {
      if (line[at] == '\\' && at + 1 < line.size()) {
        ++at;
        value += line[at] == 'n' ? '\n' : line[at];
      } else {
        value += line[at];
      }
    }
    if (at == line.size()) return false;
    ++at;  // the closing quote
    labels[name] = std::move(value);
    if (at < line.size() && line[at] == ',') ++at;
  }
  if (at == line.size()) return false;
  ++at;  // '}'
  return true;
}

// The next blank-separated token at or after `at`, moving past it.
std::string_view ReadToken(std::string_view line, size_t& at) {
  while (at < line.size() && IsBlank(line[at])) ++at;
  const size_t start = at;
  while (at < line.size() && !IsBlank(line[at])) ++at;
  return line.substr(start, at - start);
}

// `line` as a sample; nullopt when it is not one.
std::optional<PrometheusSample> ParseSample(std::string_view line) {
  PrometheusSample sample;
  size_t at = 0;
  sample.name = ReadName(line, at);
  if (sample.name.empty()) return std::nullopt;
  if (at < line.size() && line[at] == '{' && !ReadLabels(line, at, sample.labels)) {
    return std::nullopt;
  }
  if (at == line.size() || !IsBlank(line[at])) return std::nullopt;
  const std::string value(ReadToken(line, at));
  char* end = nullptr;
  sample.value = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0') return std::nullopt;
  // An optional timestamp (integer milliseconds), then nothing.
  const std::string_view timestamp = ReadToken(line, at);
  const bool integer =
      std::all_of(timestamp.begin() + (timestamp.starts_with('-') ? 1 : 0), timestamp.end(),
                  [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; });
  if (!integer || !ReadToken(line, at).empty()) return std::nullopt;
  return sample;
}

}  // namespace

std::vector<PrometheusSample> ParsePrometheusText(std::string_view text) {
  if (text.starts_with("HTTP/")) {
    const size_t body = text.find("\r\n\r\n");
    text = body == std::string_view::npos ? std::string_view() : text.substr(body + 4);
  }
  std::vector<PrometheusSample> samples;
  while (!text.empty()) {
    const size_t newline = std::min(text.find('\n'), text.size());
    std::string_view line = text.substr(0, newline);
    text.remove_prefix(std::min(newline + 1, text.size()));
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (auto sample = ParseSample(line)) samples.push_back(std::move(*sample));
  }
  return samples;
}

std::optional<double> PrometheusValue(std::string_view text, std::string_view name,
                                      const PrometheusLabels& labels) {
  for (const PrometheusSample& s : ParsePrometheusText(text)) {
    if (s.name == name && std::includes(s.labels.begin(), s.labels.end(), labels.begin(),
                                        labels.end())) {
      return s.value;
    }
  }
  return std::nullopt;
}

}  // namespace parasync::testing
