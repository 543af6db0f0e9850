// lockstep-click-log: writes a synthetic click log (click_log.h) as the train and test files of a
// parameter-server job (data format clickLog, click_log_file.h), and prints the best AUC any
// model can reach on its test file: the AUC of the true click probabilities.
//
//   lockstep-click-log --samples 200000 --test-samples 50000 --fields 8 --vocabulary 1000
//       --seed 1 DIR          # (one line) the defaults; writes DIR/train.tsv.gz and test.tsv.gz
//
// Exit status: 0 written, 2 bad arguments, 1 a file could not be written.
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "worker/ps/click_log.h"
#include "worker/ps/click_log_file.h"

namespace {

int Usage(const std::string& problem) {
  std::cerr << "lockstep-click-log: " << problem << "\n"
            << "usage: lockstep-click-log [--samples N] [--test-samples N] [--fields F]\n"
            << "                          [--vocabulary V] [--seed S] DIR\n";
  return 2;
}

template <typename T>
bool Parse(const std::string& text, T* out) {
  std::istringstream in(text);
  in >> *out;
  return !in.fail() && in.eof();
}

}  // namespace

int main(int argc, char** argv) {
  using lockstep::ps::ClickLog;
  lockstep::ps::ClickLogSpec spec;
  spec.samples = 200000;
  spec.vocabulary = 1000;  // every id seen often enough in 200,000 samples to be learned
  int64_t test_samples = 50000;
  std::string dir;
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag.rfind("--", 0) != 0) {
      if (!dir.empty()) return Usage("one directory, got " + dir + " and " + flag);
      dir = flag;
      continue;
    }
    if (i + 1 >= args.size()) return Usage(flag + " needs a value");
    const std::string& value = args[++i];
    bool ok = false;
    if (flag == "--samples") {
      ok = Parse(value, &spec.samples) && spec.samples >= 1;
    } else if (flag == "--test-samples") {
      ok = Parse(value, &test_samples) && test_samples >= 1;
    } else if (flag == "--fields") {
      ok = Parse(value, &spec.fields) && spec.fields >= 1 && spec.fields <= 1024;
    } else if (flag == "--vocabulary") {
      ok = Parse(value, &spec.vocabulary) && spec.vocabulary >= 1 &&
           spec.vocabulary <= (int64_t{1} << 40);
    } else if (flag == "--seed") {
      ok = Parse(value, &spec.seed);
    } else {
      return Usage("unknown flag " + flag);
    }
    if (!ok) return Usage(flag + ": \"" + value + "\" is out of range or not a number");
  }
  if (dir.empty()) return Usage("no directory given");
  if ((spec.samples + test_samples) * spec.fields > lockstep::ps::kMaxClickLogIds) {
    return Usage("(samples + test samples) x fields is more than a file may hold");
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    std::cerr << "lockstep-click-log: " << dir << ": " << error.message() << "\n";
    return 1;
  }
  // One log, cut in two: the test samples follow the train samples (the same model).
  const int64_t train_samples = spec.samples;
  spec.samples += test_samples;
  ClickLog log = lockstep::ps::GenerateClickLog(spec);
  ClickLog train, test;
  const size_t cut = static_cast<size_t>(train_samples) * static_cast<size_t>(log.fields);
  train.samples = train_samples;
  train.fields = test.fields = log.fields;
  train.ids.assign(log.ids.begin(), log.ids.begin() + static_cast<std::ptrdiff_t>(cut));
  train.labels.assign(log.labels.begin(), log.labels.begin() + train_samples);
  test.samples = test_samples;
  test.ids.assign(log.ids.begin() + static_cast<std::ptrdiff_t>(cut), log.ids.end());
  test.labels.assign(log.labels.begin() + train_samples, log.labels.end());
  std::vector<double> ceiling(log.probabilities.begin() + train_samples, log.probabilities.end());
  for (const auto& [name, part] :
       {std::pair<const char*, const ClickLog*>{"train", &train}, {"test", &test}}) {
    const std::string path = dir + "/" + name + ".tsv.gz";
    if (lockstep::Status written = lockstep::ps::WriteClickLogFile(*part, path); !written.ok()) {
      std::cerr << "lockstep-click-log: " << written.message() << "\n";
      return 1;
    }
  }
  std::cout << std::fixed << std::setprecision(4) << "wrote " << dir << "/train.tsv.gz ("
            << train_samples << " samples) and " << dir << "/test.tsv.gz (" << test_samples
            << " samples) of " << spec.fields << " fields; the best reachable test AUC is "
            << lockstep::ps::Auc(ceiling, test.labels) << "\n";
  return 0;
}
