// Click logs in files (the manifest's data format clickLog), read by the workers of a
// parameter-server job and written by `lockstep-click-log`.
//
// A file is one sample per line, gzip or plain (told by its content):
//   label <TAB> feature_1 <TAB> ... <TAB> feature_F
// label is 0 or 1; each feature is any text without a tab (Criteo's hexadecimal categories, a
// word, a number), empty for a missing one. Feature f's text is hashed with the field, so that
// the same text in two fields is two features:
//   id = (f << 40) | (hash(text) mod 2^40)
// and the model hashes the id into its table's rows (RowOfId). Blank lines are skipped.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(ClickLog log, ReadClickLogFile("spec.trainer.data.train[0]",
//                                                            "/data/ctr/train.tsv.gz", 8));
//
// Errors name the field, the file and the line: "spec.trainer.data.train[0]: /d/t.tsv: line 7:
// 5 features, but model.embedding.fields is 8". NotFound for a missing file, PermissionDenied
// for an unreadable one, InvalidArgument for its contents.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "worker/ps/click_log.h"

namespace lockstep::ps {

// Most bytes one line may hold, and most feature ids one file may give (fields x samples, 8
// bytes each in memory): past them a file is refused before it is held.
inline constexpr int64_t kMaxClickLogLineBytes = int64_t{1} << 20;
inline constexpr int64_t kMaxClickLogIds = int64_t{1} << 31;

// The id of feature text `text` in field `field`.
uint64_t ClickFeatureId(int32_t field, const std::string& text);

// Reads `path` (`where` names it in errors: the manifest field). Every line must have `fields`
// features. probabilities stay empty (a file has no true model).
StatusOr<ClickLog> ReadClickLogFile(const std::string& where, const std::string& path,
                                    int32_t fields);

// Writes `log` to `path` (gzip when it ends in .gz): each feature as its id within its field, in
// decimal. Atomic: written beside it and renamed.
Status WriteClickLogFile(const ClickLog& log, const std::string& path);

}  // namespace lockstep::ps
