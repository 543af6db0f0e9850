#include "worker/agent/progress_file.h"

#include <fstream>
#include <nlohmann/json.hpp>

namespace lockstep::agent {
namespace {

// At most this much is read per call, so a program that floods the file cannot stall a beat.
constexpr int64_t kMaxReadBytes = 4 << 20;

}  // namespace

std::optional<ProgressLine> ParseProgressLine(const std::string& line) {
  nlohmann::json doc = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return std::nullopt;
  auto step = doc.find("step");
  if (step == doc.end() || !step->is_number()) return std::nullopt;
  ProgressLine progress;
  progress.step = step->get<int64_t>();
  if (auto it = doc.find("samples"); it != doc.end() && it->is_number()) {
    progress.samples = it->get<int64_t>();
  }
  if (auto it = doc.find("loss"); it != doc.end() && it->is_number()) {
    progress.loss = it->get<double>();
    progress.has_loss = true;
  }
  if (auto it = doc.find("total_steps"); it != doc.end() && it->is_number()) {
    progress.total_steps = it->get<int64_t>();
  }
  return progress;
}

std::optional<ProgressLine> ProgressFileReader::ReadNew() {
  std::ifstream file(path_, std::ios::binary);
  if (!file) return std::nullopt;
  file.seekg(0, std::ios::end);
  const int64_t size = static_cast<int64_t>(file.tellg());
  if (size < offset_) {  // truncated and rewritten
    offset_ = 0;
    partial_.clear();
  }
  if (size == offset_) return std::nullopt;
  const int64_t length = std::min(size - offset_, kMaxReadBytes);
  std::string chunk(static_cast<size_t>(length), '\0');
  file.seekg(offset_);
  file.read(chunk.data(), length);
  chunk.resize(static_cast<size_t>(file.gcount()));
  offset_ += static_cast<int64_t>(chunk.size());
  partial_ += chunk;

  std::optional<ProgressLine> newest;
  size_t start = 0;
  for (size_t newline; (newline = partial_.find('\n', start)) != std::string::npos;) {
    const std::string line = partial_.substr(start, newline - start);
    start = newline + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (auto parsed = ParseProgressLine(line)) {
      newest = parsed;
    } else {
      ++invalid_lines_;
    }
  }
  partial_.erase(0, start);
  return newest;
}

}  // namespace lockstep::agent
