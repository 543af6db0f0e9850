# lockstep_data: the built-in trainer's data sets (IDX, CSV), the global sampler, the estimate
# of a rank's memory that validation compares with what a pod or machine offers, and the
# pipeline's plan (which layers each stage holds, its schedule) that the estimate follows.
# Included from worker/trainer/CMakeLists.txt; owned by the data module.
add_library(lockstep_data STATIC
  ${CMAKE_CURRENT_LIST_DIR}/dataset.cc
  ${CMAKE_CURRENT_LIST_DIR}/memory_estimate.cc
  ${CMAKE_CURRENT_LIST_DIR}/pipeline_schedule.cc
  ${CMAKE_CURRENT_LIST_DIR}/sampler.cc)
target_link_libraries(lockstep_data
  PUBLIC lockstep_spec lockstep_base
  PRIVATE ZLIB::ZLIB)
