# lockstep_kube_testenv: a real kube-apiserver + etcd on loopback for tests (kube_testenv.h), and
# a kubelet double that runs or fakes the pods of one node against it (kubelet_simulator.h).
# kube_testenv_server is the same API server as a program, for tests in other languages
# (kube_testenv_server.cc). Include this file from a test folder's CMakeLists.txt; it defines the
# targets once.
if(NOT TARGET lockstep_kube_testenv)
  add_library(lockstep_kube_testenv STATIC
    ${PROJECT_SOURCE_DIR}/tests/support/kube/kube_testenv.cc
    ${PROJECT_SOURCE_DIR}/tests/support/kube/kubelet_simulator.cc)
  target_include_directories(lockstep_kube_testenv PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_definitions(lockstep_kube_testenv PRIVATE
    LOCKSTEP_KUBE_APISERVER_SCRIPT="${PROJECT_SOURCE_DIR}/scripts/kubernetes.sh")
  target_link_libraries(lockstep_kube_testenv PUBLIC
    lockstep_base lockstep_test_process nlohmann_json::nlohmann_json Threads::Threads
    PRIVATE lockstep_spec yaml-cpp)

  add_executable(kube_testenv_server ${PROJECT_SOURCE_DIR}/tests/support/kube/kube_testenv_server.cc)
  target_link_libraries(kube_testenv_server PRIVATE lockstep_kube_testenv)
endif()
