// The manifest walker's sections (internal to common/spec): training_job_parse.cc reads the
// manifest and its spec, training_job_parse_trainer.cc the trainer section.
#pragma once

#include <cstdint>
#include <limits>
#include <string_view>

#include "common/spec/field_reader.h"
#include "common/spec/training_job.h"

namespace lockstep::spec::internal {

inline constexpr int32_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// The map `key` of `parent`, read with the fields that manifest_fields.h lists for its path: the
// one table of field names the CRD test checks too.
ObjectReader ChildMap(const ObjectReader& parent, std::string_view key);

// spec.trainer, into `trainer`; problems go to the reader's list.
void ReadTrainer(const ObjectReader& spec, TrainerSpec* trainer);

// What a pipeline (spec.trainer.pipeline) cannot be combined with elsewhere in the spec, named by
// the field that conflicts, and the world it needs. After the whole spec is read.
void CheckPipeline(const ObjectReader& spec_reader, const TrainingJobSpec& spec);

// What parameter-server training (spec.parameterServers, sync.strategy parameterServer, the
// model's embedding, data format clickLog) needs of the rest of the spec. After the whole spec
// is read.
void CheckParameterServers(const ObjectReader& spec_reader, const TrainingJobSpec& spec);

}  // namespace lockstep::spec::internal
