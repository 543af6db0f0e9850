// The manifest's spelling of every enum in training_job.h, in one table per enum, shared by
// ToString, the parser (with its "must be one of ..." message) and ToJson.
#pragma once

#include <string>
#include <string_view>

#include "common/spec/training_job.h"

namespace lockstep::spec::internal {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

template <typename E>
struct EnumTable;

template <>
struct EnumTable<Activation> {
  static constexpr EnumName<Activation> kEntries[] = {
      {Activation::kRelu, "relu"}, {Activation::kGelu, "gelu"}, {Activation::kTanh, "tanh"}};
};
template <>
struct EnumTable<DataFormat> {
  static constexpr EnumName<DataFormat> kEntries[] = {
      {DataFormat::kIdx, "idx"}, {DataFormat::kCsv, "csv"}, {DataFormat::kClickLog, "clickLog"}};
};
template <>
struct EnumTable<OptimizerType> {
  static constexpr EnumName<OptimizerType> kEntries[] = {{OptimizerType::kSgd, "sgd"},
                                                         {OptimizerType::kAdamW, "adamw"}};
};
template <>
struct EnumTable<LrScaling> {
  static constexpr EnumName<LrScaling> kEntries[] = {{LrScaling::kNone, "none"},
                                                     {LrScaling::kLinear, "linear"}};
};
template <>
struct EnumTable<Device> {
  static constexpr EnumName<Device> kEntries[] = {{Device::kCpu, "cpu"}, {Device::kCuda, "cuda"}};
};
template <>
struct EnumTable<Precision> {
  static constexpr EnumName<Precision> kEntries[] = {{Precision::kFp32, "fp32"},
                                                     {Precision::kBf16, "bf16"}};
};
template <>
struct EnumTable<PipelineSchedule> {
  static constexpr EnumName<PipelineSchedule> kEntries[] = {{PipelineSchedule::kGpipe, "gpipe"},
                                                            {PipelineSchedule::k1F1B, "1f1b"}};
};
template <>
struct EnumTable<Compression> {
  static constexpr EnumName<Compression> kEntries[] = {
      {Compression::kNone, "none"}, {Compression::kBf16, "bf16"}, {Compression::kFp16, "fp16"}};
};
template <>
struct EnumTable<SyncStrategy> {
  static constexpr EnumName<SyncStrategy> kEntries[] = {
      {SyncStrategy::kAllreduce, "allreduce"},
      {SyncStrategy::kLocalSgd, "localSGD"},
      {SyncStrategy::kDgc, "dgc"},
      {SyncStrategy::kParameterServer, "parameterServer"}};
};
template <>
struct EnumTable<ParameterServerMode> {
  static constexpr EnumName<ParameterServerMode> kEntries[] = {
      {ParameterServerMode::kSync, "sync"},
      {ParameterServerMode::kAsync, "async"},
      {ParameterServerMode::kGeo, "geo"}};
};
template <>
struct EnumTable<NetworkMode> {
  static constexpr EnumName<NetworkMode> kEntries[] = {{NetworkMode::kTcp, "tcp"},
                                                       {NetworkMode::kRoce, "roce"},
                                                       {NetworkMode::kInfiniband, "infiniband"}};
};
template <>
struct EnumTable<RestartPolicy> {
  static constexpr EnumName<RestartPolicy> kEntries[] = {{RestartPolicy::kOnFailure, "OnFailure"},
                                                         {RestartPolicy::kExitCode, "ExitCode"},
                                                         {RestartPolicy::kNever, "Never"}};
};
template <>
struct EnumTable<GangScheduler> {
  static constexpr EnumName<GangScheduler> kEntries[] = {
      {GangScheduler::kNone, ""},
      {GangScheduler::kVolcano, "volcano"},
      {GangScheduler::kSchedulerPlugins, "scheduler-plugins"}};
};
template <>
struct EnumTable<PlacementMode> {
  static constexpr EnumName<PlacementMode> kEntries[] = {{PlacementMode::kRequired, "required"},
                                                         {PlacementMode::kPreferred, "preferred"}};
};
template <>
struct EnumTable<GlobalBatch> {
  static constexpr EnumName<GlobalBatch> kEntries[] = {
      {GlobalBatch::kFixed, "fixed"}, {GlobalBatch::kScaleWithWorld, "scaleWithWorld"}};
};

template <typename E>
const char* EnumToString(E value) {
  for (const auto& entry : EnumTable<E>::kEntries) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

// Exact, case-sensitive match, as the API server's enum validation does.
template <typename E>
bool EnumFromString(std::string_view name, E* value) {
  for (const auto& entry : EnumTable<E>::kEntries) {
    if (name == entry.name) {
      *value = entry.value;
      return true;
    }
  }
  return false;
}

// "relu, gelu, tanh"; an empty spelling shows as "".
template <typename E>
std::string EnumChoices() {
  std::string choices;
  for (const auto& entry : EnumTable<E>::kEntries) {
    if (!choices.empty()) choices += ", ";
    choices += *entry.name == '\0' ? "\"\"" : entry.name;
  }
  return choices;
}

}  // namespace lockstep::spec::internal
