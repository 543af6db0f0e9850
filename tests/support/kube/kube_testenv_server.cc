// kube_testenv_server: KubeTestEnv (kube_testenv.h) as a program, for tests written in other
// languages (tests/packaging/prometheus_scrape_test.py runs lockstep-operator against it).
//
//   kube_testenv_server [--crd FILE]... [--build-timeout-s S] [--start-timeout-s S]
//
// Starts etcd and kube-apiserver 1.20.2 on loopback (a first run builds kube-apiserver: minutes),
// installs each --crd file (YAML, one or more CustomResourceDefinitions) and waits until its
// resources are served, then prints one JSON line to stdout:
//
//   {"kubeconfig": PATH, "server": "https://127.0.0.1:PORT", "token": T, "ca": PATH, "dir": DIR}
//
// and runs until stdin reaches EOF (the caller closes its pipe or dies) or it gets SIGTERM/SIGINT;
// then it stops kube-apiserver and etcd and removes its directory (LOCKSTEP_KEEP_KUBE_TESTENV=1
// keeps it). Keep stdin open (a pipe) while the servers should run: `< /dev/null` stops them at
// once. Exit codes: 0 after a clean stop, 1 when the servers or a CRD could not be set up (the
// reason on stderr), 2 on bad arguments. A signal or EOF while the servers are still starting
// exits at once with 1; the servers' guards stop them when this process is gone.
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/kube/kube_testenv.h"

namespace {

using json = nlohmann::json;
using lockstep::testing::KubeTestEnv;

constexpr char kUsage[] =
    "usage: kube_testenv_server [--crd FILE]... [--build-timeout-s S] [--start-timeout-s S]\n";

std::atomic<bool> stop_requested{false};

// Returns the signal, 0 on stdin EOF, -1 when neither happened within tick_ms.
int WaitForStop(const sigset_t& signals, bool* watch_stdin, int tick_ms) {
  if (*watch_stdin) {
    pollfd in{STDIN_FILENO, POLLIN, 0};
    int ready = poll(&in, 1, 0);
    if (ready > 0) {
      if (in.revents & POLLNVAL) {
        *watch_stdin = false;  // no stdin at all: signals only
      } else {
        char buffer[4096];
        ssize_t n = read(STDIN_FILENO, buffer, sizeof(buffer));  // input is ignored
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return 0;
      }
    }
  }
  timespec tick{tick_ms / 1000, (tick_ms % 1000) * 1000L * 1000L};
  int signal_number = sigtimedwait(&signals, nullptr, &tick);
  return signal_number > 0 ? signal_number : -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> crds;
  lockstep::testing::KubeTestEnvOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    auto take = [&](const std::string& name) {
      if (arg.rfind(name + "=", 0) == 0) {
        value = arg.substr(name.size() + 1);
        return true;
      }
      if (arg == name && i + 1 < argc) {
        value = argv[++i];
        return true;
      }
      return false;
    };
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (take("--crd")) {
      crds.push_back(value);
    } else if (take("--build-timeout-s")) {
      options.build_timeout_ms = std::atoll(value.c_str()) * 1000;
    } else if (take("--start-timeout-s")) {
      options.start_timeout_ms = std::atoll(value.c_str()) * 1000;
    } else {
      std::cerr << "kube_testenv_server: bad argument " << arg << "\n" << kUsage;
      return 2;
    }
  }
  if (options.build_timeout_ms <= 0 || options.start_timeout_ms <= 0) {
    std::cerr << "kube_testenv_server: timeouts must be positive\n";
    return 2;
  }
  for (const std::string& crd : crds) {
    if (access(crd.c_str(), R_OK) != 0) {
      std::cerr << "kube_testenv_server: cannot read --crd " << crd << "\n";
      return 2;
    }
  }

  // Signals go to this thread's sigtimedwait only (blocked before any thread starts).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill us before the teardown

  // Start (and the CRDs) on a thread, so that a stop request while it runs is seen at once.
  std::mutex mutex;
  std::unique_ptr<KubeTestEnv> kube;
  std::string error;
  std::atomic<bool> started{false};
  std::thread starter([&] {
    std::string why;
    std::cerr << "kube_testenv_server: starting etcd and kube-apiserver (a first run builds "
                 "kube-apiserver: minutes)\n";
    std::unique_ptr<KubeTestEnv> env = KubeTestEnv::Start(options, &why);
    if (env) {
      for (const std::string& crd : crds) {
        if (stop_requested.load()) break;
        if (!env->InstallCrds(crd, &why)) {
          why += "\n" + env->LogTails();
          env.reset();
          break;
        }
      }
    }
    std::lock_guard<std::mutex> lock(mutex);
    kube = std::move(env);
    error = why;
    started.store(true);
  });

  bool watch_stdin = true;
  bool announced = false;
  int exit_code = 0;
  while (true) {
    int stop = WaitForStop(signals, &watch_stdin, 200);
    if (stop >= 0) {
      std::cerr << "kube_testenv_server: "
                << (stop == 0 ? std::string("stdin closed")
                              : "signal " + std::to_string(stop) + " received")
                << "; stopping\n";
      stop_requested.store(true);
      if (!started.load()) {
        // Start cannot be interrupted; the guards of etcd and kube-apiserver stop them when this
        // process is gone, and an unfinished build of kube-apiserver just completes its cache.
        std::cerr << "kube_testenv_server: servers still starting; exiting without waiting\n";
        std::cerr.flush();
        _exit(1);
      }
      break;
    }
    if (started.load() && !announced) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!kube) {
        std::cerr << "kube_testenv_server: " << error << "\n";
        exit_code = 1;
        break;
      }
      json ready = {{"kubeconfig", kube->kubeconfig()},
                    {"server", kube->server()},
                    {"token", kube->token()},
                    {"ca", kube->ca_file()},
                    {"dir", kube->dir()}};
      std::cout << ready.dump() << std::endl;
      std::cerr << "kube_testenv_server: ready at " << kube->server() << "\n";
      announced = true;
    }
  }
  starter.join();
  // KubeTestEnv's teardown: SIGTERM, then SIGKILL past 10 s, for each server.
  kube.reset();
  std::cerr << "kube_testenv_server: stopped\n";
  return exit_code;
}
